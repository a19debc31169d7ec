"""`--model`: a local folder, or a Hugging Face Hub id `ORG/NAME[@REVISION]` fetched into the Hub cache.

A path that exists always wins, so a folder named like an id is never shadowed by the Hub. Anything else of
the form ORG/NAME goes to `huggingface_hub.snapshot_download`, limited to the files the engine reads (no
PyTorch .bin weights, no GGUF). huggingface_hub itself honours HF_HOME (where the cache lives),
HF_HUB_OFFLINE (the cache only) and HF_TOKEN (private and gated models); nothing here overrides them. Its
download bars show on a terminal only: huggingface_hub draws its "Fetching N files" bar into a pipe or a log
file too, so they are switched off there, unless HF_HUB_DISABLE_PROGRESS_BARS has said either way.
"""
import os
import re
import stat
import sys
from pathlib import Path

from toolkit.errors import ToolkitError

# What the engine reads from a model folder (config, tokenizer, chat template, sampling defaults, weights).
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]
# ORG/NAME as the Hub spells repository ids (a letter or digit, then letters, digits, - _ .), then an optional
# @REVISION (a branch, tag or commit). "../x" and "./x" are paths.
_HUB_ID = re.compile(r"(\w[\w.-]*/\w[\w.-]*)(?:@(.+))?")


def resolve_model(model) -> Path:
    """The local folder `model` names: itself when the path exists, else the Hub snapshot of ORG/NAME[@REV]."""
    path = Path(model)
    match = _HUB_ID.fullmatch(str(model))
    if match and not os.path.lexists(path):
        path = _download(str(model), *match.groups())
    try:
        is_dir = stat.S_ISDIR(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_dir = False
    except OSError as e:  # a parent folder that may not be searched
        raise ToolkitError(f"{path}: {e.strerror}") from None
    if not is_dir:
        raise ToolkitError(f"{model}: no such model folder")
    if not os.access(path, os.R_OK | os.X_OK):  # else the first file inside fails with a bare PermissionError
        raise ToolkitError(f"{path}: permission denied (the model folder cannot be read)")
    return path


def _download(model: str, repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = not is_terminal(sys.stderr) and constants.HF_HUB_DISABLE_PROGRESS_BARS is None \
        and not are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except GatedRepoError:
        raise ToolkitError(f"{model}: a gated model on the Hugging Face Hub: accept its terms on the Hub and "
                           "set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ToolkitError(f"{model}: no such local folder, and no such model on the Hugging Face Hub (a private "
                           "one needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ToolkitError(f"{model}: the Hugging Face Hub has no revision {revision!r} of {repo_id}") from None
    except LocalEntryNotFoundError as e:  # not in the cache, and the Hub was not asked or did not answer
        where = f"{model}: no such local folder, not (or only partly) in the Hugging Face cache " \
                f"({constants.HF_HUB_CACHE})"
        if constants.HF_HUB_OFFLINE:
            raise ToolkitError(f"{where}, and HF_HUB_OFFLINE is set") from None
        raise ToolkitError(f"{where}, and the Hugging Face Hub cannot be reached ({_first_line(e.__cause__ or e)})") \
            from None
    except Exception as e:  # the network (httpx), the Hub's HTTP errors, the cache's disk: outside the program
        raise ToolkitError(f"{model}: download from the Hugging Face Hub failed ({_first_line(e)})") from None
    finally:
        if quiet:  # as it was: an LLM() in a longer program leaves huggingface_hub's settings alone
            enable_progress_bars()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def is_terminal(stream) -> bool:
    """Whether `stream` is a terminal (the Hub's bars here; the CLI's chat UI and progress bar too)."""
    try:
        return stream is not None and stream.isatty()
    except (ValueError, AttributeError):  # a closed or odd stream
        return False
