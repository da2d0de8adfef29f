"""``import profkit`` with whatever PROFKIT_* variables the environment holds, and nothing
else (not even ``_fresh``); reports ``stats()["root_calls"]`` (0: nothing ran)."""

import json

import profkit

print("REPORT " + json.dumps({"root_calls": profkit.stats()["root_calls"]}), flush=True)
