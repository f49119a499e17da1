"""Bytes for the WAL: records as MessagePack (msgspec), exact for ints and float64."""
from __future__ import annotations

import msgspec

from trace_pipeline.records import RewardRecord, TraceRecord

_encoder = msgspec.msgpack.Encoder()
_trace_decoder = msgspec.msgpack.Decoder(TraceRecord)
_reward_decoder = msgspec.msgpack.Decoder(RewardRecord)


class TraceOwner(msgspec.Struct):
    """The few fields ownership checks need; decoding skips the token lists."""
    request_id: str
    session_id: str
    team: str
    choice_index: int = 0


_owner_decoder = msgspec.msgpack.Decoder(TraceOwner)


def encode(record: TraceRecord | RewardRecord) -> bytes:
    return _encoder.encode(record)


def decode_trace(payload: bytes) -> TraceRecord:
    return _trace_decoder.decode(payload)


def decode_owner(payload: bytes) -> TraceOwner:
    return _owner_decoder.decode(payload)


def decode_reward(payload: bytes) -> RewardRecord:
    return _reward_decoder.decode(payload)
