import verifiers.v1 as vf
from tiny_add.tools import AddToolset

# Built in code: no dataset download (no HF hub, no `datasets` package needed).
ROWS = [(2, 3), (10, 32), (7, 8), (100, 1), (4, 4), (6, 9), (12, 30), (5, 5)]


class TinyAddData(vf.TaskData):
    a: int
    b: int


class TinyAddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()  # runtime: subprocess by default


class TinyAddTask(vf.Task[TinyAddData, vf.State, TinyAddTaskConfig]):
    @classmethod
    def toolsets(cls, config: TinyAddTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if str(self.data.a + self.data.b) in trace.last_reply else 0.0


class TinyAddConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: TinyAddTaskConfig = TinyAddTaskConfig()


class TinyAddTaskset(vf.Taskset[TinyAddTask, TinyAddConfig]):
    def load(self) -> list[TinyAddTask]:
        return [
            TinyAddTask(
                TinyAddData(
                    id=f"add-{i}",
                    prompt=f"What is {a} + {b}? Use the add tool.",
                    a=a,
                    b=b,
                ),
                self.config.task,
            )
            for i, (a, b) in enumerate(ROWS[: self.config.num_tasks])
        ]
