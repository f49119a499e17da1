"""RL traces: capture in the front door, crash-safe storage, rewards, training exports.

Entry points: capture.TraceCapture, api.rewards_router, export.export,
export.import_verifiers, cli.add_traces_commands. See docs/traces.md.
"""
