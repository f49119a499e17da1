import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    # None: advertise the tool bare as `add` (default would be `<prefix>_add`).
    TOOL_PREFIX = None

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return their sum."""
        return a + b


if __name__ == "__main__":
    # The subprocess runtime starts this as `python -m tiny_add.tools` (an MCP server).
    AddToolset.run()
