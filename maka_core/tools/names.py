"""The names of the tools maka ships, declared once: the built-in tools and the MELRA family. The
tool classes take their ``name`` from here, and what must know the names without the tools (a tool
set's groups, ``tools.offer``) reads them here, below every tool.
"""

from __future__ import annotations

from typing import Final

READ_FILE: Final = "read_file"
LIST_DIR: Final = "list_dir"
WRITE_FILE: Final = "write_file"
EDIT_FILE: Final = "edit_file"
BASH: Final = "bash"
#: The five built-in tools.
BUILTIN_TOOL_NAMES: Final = frozenset({READ_FILE, LIST_DIR, WRITE_FILE, EDIT_FILE, BASH})

MELRA_PLAN: Final = "melra_plan"
MELRA_EXECUTE: Final = "melra_execute"
MELRA_TASK_STATUS: Final = "melra_task_status"
MELRA_RECEIPT: Final = "melra_receipt"
#: The MELRA family.
MELRA_TOOL_NAMES: Final = frozenset({MELRA_PLAN, MELRA_EXECUTE, MELRA_TASK_STATUS, MELRA_RECEIPT})
