"""Test settings with the queue in its own database (alias "queue") behind CairnQRouter.

A third alias, "extra", is left unrouted: tests put CairnQ tables there by hand
to show that `using=` overrides the configured alias.
"""

import copy
import os

from .settings import *  # noqa: F401,F403
from .settings import BACKEND, DATABASES

DATABASES = copy.deepcopy(DATABASES)
_default = DATABASES["default"]
for _alias in ("queue", "extra"):
    _config = copy.deepcopy(_default)
    if BACKEND == "postgres":
        _config["TEST"] = {"NAME": f"{_default['TEST']['NAME']}_{_alias}"}
    else:
        _root, _ext = os.path.splitext(_default["TEST"]["NAME"])
        _config["TEST"] = {"NAME": f"{_root}_{_alias}{_ext}"}
    DATABASES[_alias] = _config

DATABASE_ROUTERS = ["cairnq_django.routers.CairnQRouter"]
CAIRNQ = {"DATABASE": "queue"}
