"""L4's summary calls: made inline or ahead (prepared), forked or separate, single-flight."""
