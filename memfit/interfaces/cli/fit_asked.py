"""`memfit fit FILE --attn sdpa ...`: settings the user asks for, written into the file and planned from. Every
knob flag of `memfit estimate` is one, so an error's advice ("use --attn sdpa" for a T4 that rejects flash
attention) is a flag fit takes as it is."""
from __future__ import annotations

import argparse

from memfit.errors import MemfitError
from memfit.facts.knobs import knobs

# fit has its own --ref/--reward/--critic-model (a model, not a setting to write)
NOT_ASKED = ("ref_model", "reward_model", "critic_model")


def add_asked_arguments(p: argparse.ArgumentParser) -> None:
    from memfit.interfaces.cli.args import _add

    from memfit.facts.knobs import inputs

    _add(p, inputs()["profile"])  # the framework that runs the file (default: the one its format implies)
    group = p.add_argument_group("settings to change in the file (each written into it; the plan starts from them)")
    for name, k in knobs().items():
        if name not in NOT_ASKED:
            _add(group, k)


def asked_knobs(a: argparse.Namespace) -> dict:
    """The knobs typed on fit's command line, typed as the scenario takes them."""
    from memfit.interfaces.cli.args import knobs_from_args

    return {k: v for k, v in knobs_from_args(a).items() if v is not None and k not in NOT_ASKED}


def file_values(imported, asked: dict) -> dict:
    """What the file said for each asked knob (None: it said nothing), so the asked value is a change to write."""
    return {k: imported.knobs.get(k) for k in asked}


def check_sayable(asked: dict, said: frozenset, imported) -> None:
    """An asked knob the file has no key for cannot be written: one line naming it."""
    from memfit.interfaces.cli.next_steps import flag_words

    lost = [k for k in asked if k not in said]
    if lost:
        flag = flag_words(lost[0], asked[lost[0]])[0]
        raise MemfitError(f"{flag}: {imported.name} ({imported.format}) has no key for {lost[0]}; set it where the "
                          "run sets it (training arguments, the launch command) and fit that file, or fit without it")
