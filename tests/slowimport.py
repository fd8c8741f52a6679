"""A module whose import takes 30 s (see ``startupenvs``): imported by a test script's top level."""

import time

import startupenvs

startupenvs.note("import")
time.sleep(startupenvs.SLOW_S)
