"""Strict order parameters (groups): validation, the stable 64-bit hash, and partition assignment."""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidArgument

DEFAULT_PARTITIONS = 64
MAX_GROUP_LENGTH = 128
# SQS MessageGroupId: alphanumerics and punctuation, at most 128 characters.
GROUP_RE = re.compile(r"""^[A-Za-z0-9!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$""")
# Groups the core invents for messages sent without one; they name their partition so that unordered
# traffic is spread round-robin over partitions (the patent) instead of by hash.
AUTO_GROUP_PREFIX = "~auto."
MESSAGE_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def validate_group(group: object) -> str:
    if not isinstance(group, str) or not GROUP_RE.fullmatch(group):
        raise InvalidArgument(
            f"group must be 1-{MAX_GROUP_LENGTH} characters of letters, digits and ASCII punctuation",
            field="group",
        )
    if group.startswith(AUTO_GROUP_PREFIX):
        raise InvalidArgument(f"group names starting with {AUTO_GROUP_PREFIX!r} are reserved", field="group")
    return group


def validate_message_id(message_id: object) -> str:
    if not isinstance(message_id, str) or not MESSAGE_ID_RE.fullmatch(message_id):
        raise InvalidArgument(
            "message ids are 1-128 characters of letters, digits, '_', '.', ':' and '-'", field="id"
        )
    return message_id


def group_hash(group: str) -> int:
    """Stable across processes and versions (unlike `hash()`), so every node agrees on placement."""
    return int.from_bytes(hashlib.blake2b(group.encode(), digest_size=8).digest(), "big")


def auto_group(partition: int, message_id: str) -> str:
    return f"{AUTO_GROUP_PREFIX}{partition:x}.{message_id}"


def partition_of(group: str, partitions: int) -> int:
    if group.startswith(AUTO_GROUP_PREFIX):
        head = group[len(AUTO_GROUP_PREFIX) :].split(".", 1)[0]
        try:
            return int(head, 16) % partitions
        except ValueError:
            pass
    return group_hash(group) % partitions
