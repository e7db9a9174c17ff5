"""What is decided per deployment: compaction policies per role, the file-read tools L2
recognises, and who may resolve which source pointers."""

from ._compaction import DEFAULT_READ_TOOLS, CompactionPolicy, ReadToolSpec
from ._roles import ROLE_NAMES, RolePolicies, RoleRule
from ._source_access import SourceAccessPolicy, own_session_only

__all__ = ["CompactionPolicy", "DEFAULT_READ_TOOLS", "ROLE_NAMES", "ReadToolSpec", "RolePolicies",
           "RoleRule", "SourceAccessPolicy", "own_session_only"]
