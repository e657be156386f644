"""``pinfeed.Source``: a source with options of its own, where one loader reads several (a
mixture's sources: ``TokenLoader({"web": "web/", "code": pinfeed.Source("s3://b/code/",
storage_options={...})}, weights=...)``)."""

import os
from typing import Any, Union

from ._sources import source_path
from .errors import PinfeedTypeError

__all__ = ["Source"]

# The options a source of a mixture may carry: its stored token width and its object-store
# settings; every other option is the loader's.
_OPTIONS = ("token_dtype", "storage_options", "cache_dir", "cache_limit", "queue_depth")


class Source:
    """A path or URL with options of its own: ``token_dtype`` (the stored token width, for a
    raw token file), ``storage_options``, ``cache_dir``, ``cache_limit`` and ``queue_depth``
    (as the loaders take them, for a source in object storage). An option a source does not
    give is the loader's."""

    __slots__ = ("path", "options")

    def __init__(self, path: Union[str, "os.PathLike[str]"], **options: Any) -> None:
        self.path: str = source_path(path, "Source")
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise PinfeedTypeError(
                f"{self.path}: Source takes {', '.join(_OPTIONS)}; not {', '.join(unknown)}"
            )
        #: The options given, by name.
        self.options: dict[str, Any] = dict(options)

    def __repr__(self) -> str:
        given = "".join(f", {k}={v!r}" for k, v in self.options.items() if k != "storage_options")
        return f"Source({self.path!r}{given})"
