"""A minimal local verifiers 0.4 taskset: add two numbers, with one `add` tool."""

from tiny_add.taskset import TinyAddTaskset

__all__ = ["TinyAddTaskset"]
