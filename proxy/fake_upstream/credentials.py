"""The credentials the fake Bedrock and Vertex know (test values, public on purpose)."""

from typing import Final

__all__ = [
    "TEST_AWS_ACCESS_KEY",
    "TEST_AWS_SECRET_KEY",
    "TEST_BEDROCK_API_KEY",
    "TEST_VERTEX_TOKEN",
]

TEST_AWS_ACCESS_KEY: Final = "AKIAFAKEBEDROCK00001"
TEST_AWS_SECRET_KEY: Final = "fake+bedrock/secret+key+for+tests+only0"
TEST_BEDROCK_API_KEY: Final = "ABSKfakebedrockapikey"
TEST_VERTEX_TOKEN: Final = "ya29.fake-vertex-access-token"
