import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_dev_script(name: str):
    """dev/<name>.py as a module (dev/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"dev_{name}", ROOT / "dev" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
