"""Source pointers: the resolvers that verify them, transcripts and object-store roots."""
