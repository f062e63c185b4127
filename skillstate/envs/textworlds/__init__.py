"""Text worlds run by a JVM: TextWorldExpress and ScienceWorld (the
`textworlds` extra: `pip install "skillstate[textworlds]"`, and Java on
PATH). Importing this package needs neither; the first episode checks both.

Built-in env names: `textworld_express` (`TextWorldExpress`) and
`scienceworld` (`ScienceWorld`).
"""

from skillstate.envs.textworlds.java import require_java, require_package
from skillstate.envs.textworlds.pool import ProcessPool
from skillstate.envs.textworlds.scienceworld import ScienceWorld
from skillstate.envs.textworlds.twx import TextWorldExpress

TWXEnv = TextWorldExpress
SWEnv = ScienceWorld

__all__ = ["ProcessPool", "ScienceWorld", "SWEnv", "TWXEnv", "TextWorldExpress", "require_java",
           "require_package"]
