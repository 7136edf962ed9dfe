"""The search: candidates (the user's scenario with some planner knobs changed) visited best-first, judged by
the estimate (device and host) and ranked by the step-time model, one row per approach.

1. Activation settings beaten in memory and speed by another (sdpa where flash runs, padded rows where
   packing is possible) are dropped up front (space.py).
2. Model-state settings are visited best-first by an upper bound on their speed (their fastest
   activation setting). Each is first estimated with its least-memory activation setting: if that does
   not fit, nothing with it fits. Otherwise its activation settings are tried fastest first, skipping any
   that needs at least as much device memory in every knob as one already out of memory; the first
   that fits (or, among those that tie with it in speed, the one with fewer changes) is the setting's candidate.
3. Candidates group into approaches (`family`: tuning, weight layout, what is offloaded); each approach
   gets one row, the simplest of those that tie with its fastest. A row is dropped when another candidate
   makes a subset of its changes, ties with it, and needs about as much memory (its extra changes buy nothing).
   Rows are fastest first, a tie ranked by fewer changes, then more memory margin. Ties are speeds closer than
   the measured tie band (speed.toml [band] tie). The visit stops when the next upper bound cannot reach the
   k-th row.
A few hundred estimates (estimate() ~0.2-6 ms, step_time() ~20 us); the visit stops after Options.budget
estimates and says so (Search.cut_short): a count, so the plan is the same on any machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from memfit.errors import MemfitError
from memfit.facts import methods
from memfit.facts.adapters import trains_adapters
from memfit.facts.engines import Sharding
from memfit.facts.scenario import Scenario
from memfit.memory.phases import verdict_of
from memfit.planner.data import Batch, DataShapes
from memfit.planner.knobs import ActKnobs, Builder, StateKnobs, act_of, changed, several_models, state_of
from memfit.planner.space import (Options, act_options, fastest, le, least_memory, pareto, search_options,
                                  state_options, unique)
from memfit.planner.speed import StepTime
from memfit.planner.step_time import step_time
from memfit.planner.throughput import tie_band
from memfit.roles.estimate import at_most_tight, estimate

ALLOW = ("lora", "qlora", "8bit")
# `memfit fit` keeps the data of a step as the user has it: these axes stay unless --allow names the word
# (packing puts other rows together: another batch per step)
DATA_CHANGES = {"packing": "padding"}
# a plan fits only when it clears its error band, as the estimate's verdict says (memfit/memory/phases.py):
# a "tight" run sits inside the band and may run out of memory
FITTING = ("fits",)
# speeds closer than the measured tie band (speed.toml [band] tie, planner/throughput.py) count as equal: among
# them the row with fewer changes (then more memory margin) wins
MEMORY_TOLERANCE = 0.02  # of GPU memory (host RAM): smaller savings do not justify an extra change


@dataclass(frozen=True)
class Judged:
    """An estimate against the hardware: host RAM over the phases the run goes through (a run that never
    resumes from a checkpoint skips the resume phase's load of the optimizer files, docs/knobs.md A.8)."""

    verdict: str
    device_peak: int  # device total per GPU at its peak
    margin: int
    host_peak: int  # per node
    host_margin: int | None
    decided_by: Batch | None = None  # --lengths: the data's micro-batch this verdict was judged at


def judge(e, resume: bool = True) -> Judged:
    hw = e.scenario.hardware
    host_peak = max(b.total for phase, b in e.host.phases.items() if resume or phase != "resume")
    host_margin = None if hw.host_ram is None else hw.host_ram - host_peak
    # a run with a memory setting no reader read is not the run estimated: never "fits" (roles/estimate.py)
    verdict = at_most_tight(verdict_of(e.margin_bytes, hw.gpu.memory_bytes, host_margin, e.band_fraction),
                            e.scenario.unread)
    return Judged(verdict, e.device_total.peak.total, e.margin_bytes, host_peak, host_margin)


VERDICT_ORDER = ("fits", "tight", "host_oom", "oom")  # worse to the right


def judge_data(s: Scenario, data: DataShapes, resume: bool = True) -> Judged:
    """The candidate at each deciding shape of the data (rows, padded length): the worst verdict, then the least
    device margin. The step-time model still speaks of --seq: only the memory judgment follows the data."""
    out = []
    for b in data.batches(s.micro_batch, s.padding):
        j = judge(estimate(s.with_changes(micro_batch=b.rows, seq_len=b.seq_len)), resume)
        out.append(replace(j, decided_by=b))
    return max(out, key=lambda j: (VERDICT_ORDER.index(j.verdict), -j.margin, j.host_peak))


@dataclass
class Candidate:
    state: StateKnobs
    act: ActKnobs
    scenario: Scenario
    speed: StepTime
    judged: Judged | None = None


def fits(e: Judged) -> bool:
    return e.verdict in FITTING


def per_gpu_batch(base: Scenario, global_batch: int | None) -> int:
    world = base.world_size
    if global_batch is None:
        return base.micro_batch * base.grad_accum
    if global_batch <= 0 or global_batch % world:
        raise MemfitError(f"--global-batch {global_batch} must be a positive multiple of the {world} GPUs "
                          f"(global batch = micro-batch x gradient accumulation x GPUs)")
    return global_batch // world


def check_allow(allow) -> set[str]:
    allow = {a.strip().lower() for a in (allow or ()) if a.strip()}
    unknown = allow - set(ALLOW)
    if unknown:
        raise MemfitError(f"--allow {','.join(sorted(unknown))} is not known; choose from: {', '.join(ALLOW)}")
    return allow


@dataclass(frozen=True)
class Keep:
    """What a search for `memfit fit` leaves as the user has it: `axes` stay at the user's value, and with
    `expressible` (scenario, axes a code edit reaches -> bool: can the user's file say it?) only settings the
    file can say are searched, so the search runs on to the fastest plan the file can express."""

    axes: frozenset = frozenset()
    expressible: Callable | None = field(default=None, compare=False)


def fit_allow(words) -> tuple[set[str], frozenset]:
    """`memfit fit --allow`: the tuning changes for the search, and the axes kept (the data changes not named)."""
    words = {w.strip().lower() for w in (words or ()) if w.strip()}
    if "seq" in words or "truncation" in words:
        raise MemfitError("--allow seq: memfit fit never changes the sequence length; `memfit plan MODEL ... "
                          "--max-seq` finds the longest that fits")
    unknown = words - set(ALLOW) - set(DATA_CHANGES)
    if unknown:
        raise MemfitError(f"--allow {','.join(sorted(unknown))} is not known; choose from: "
                          f"{', '.join((*ALLOW, *DATA_CHANGES))}")
    return words & set(ALLOW), frozenset(axis for word, axis in DATA_CHANGES.items() if word not in words)


def method_facts(base: Scenario) -> dict | None:
    """data/methods.toml facts of a several-model method (Scenario has checked the name), else None."""
    if not several_models(base):
        return None
    return methods.method_facts(base.method)


class Search:
    def __init__(self, base: Scenario, allow: set[str], global_batch: int | None, options: Options = Options(),
                 keep: Keep = Keep()):
        self.per_gpu = per_gpu_batch(base, global_batch)
        self.refused = ""  # why the last combination could not be built
        self.builder = Builder(base, self.per_gpu)
        self.base = base
        self.options = options
        self.opts = search_options(base.profile, options)
        self.facts = method_facts(base)
        self.bk, self.ak = state_of(base), act_of(base)
        self.states = self._kept(state_options(base, self.bk, self.opts, allow, self.facts), self.bk, keep)
        acts = self._kept(act_options(base, self.ak, self.opts, self.per_gpu, self.facts is not None), self.ak, keep)
        if keep.expressible is not None:  # before pareto: a setting the file cannot say beats none
            self.states, acts = self._expressible(self.states, acts, keep.expressible)
        self.acts = pareto(acts, self.ak)
        self.losses = unique(a.loss for a in self.acts)
        self.built: dict[tuple[StateKnobs, ActKnobs], Candidate | None] = {}
        self.estimates = 0
        self.cut_short = False  # the budget stopped the visit before the ranking was complete

    @staticmethod
    def _kept(options: list, user, keep: Keep) -> list:
        return [o for o in options if all(getattr(o, n) == getattr(user, n) for n in keep.axes if hasattr(user, n))]

    def _expressible(self, states: list, acts: list, says: Callable) -> tuple[list, list]:
        """The settings the user's file can say: each model-state setting as a whole (sharding, offload and
        ratio go together), each activation value alone (one key each). A setting the frameworks reject is
        left for the search to drop."""
        def ok(k: StateKnobs, a: ActKnobs) -> bool:
            try:
                s = self.builder.scenario(k, a)
            except MemfitError:
                return True
            return says(s, self.edited(k))

        states = [k for k in states if k == self.bk or ok(k, self.ak)]
        values: dict[tuple, bool] = {}
        for a in acts:
            for name in changed(self.ak, a):
                if (name, getattr(a, name)) not in values:
                    values[(name, getattr(a, name))] = ok(self.bk, replace(self.ak, **{name: getattr(a, name)}))
        acts = [a for a in acts if all(values[(n, getattr(a, n))] for n in changed(self.ak, a))]
        return states, acts

    def build(self, k: StateKnobs, a: ActKnobs) -> Candidate | None:
        """The candidate for these knobs (built once: bounds, feasibility, rows and changes ask again)."""
        if (k, a) not in self.built:
            self.built[(k, a)] = self.make(k, a)
        return self.built[(k, a)]

    def make(self, k: StateKnobs, a: ActKnobs, runnable: bool = True) -> Candidate | None:
        """A candidate, or None for a combination the frameworks reject (or, when `runnable`, one that cannot run)."""
        try:
            s = self.builder.scenario(k, a)
            speed = step_time(s)
        except MemfitError as e:
            self.refused = str(e)
            return None  # a combination the frameworks reject (the scenario says which)
        if runnable and speed.tokens_per_second <= 0:
            return None  # it cannot run (vLLM without room for one sequence's KV cache)
        return Candidate(k, a, s, speed)

    def estimate(self, c: Candidate) -> Judged:
        if c.judged is None:
            data, resume = self.options.data, self.options.resume
            c.judged = judge_data(c.scenario, data, resume) if data else judge(estimate(c.scenario), resume)
            self.estimates += 1
        return c.judged

    def edited(self, k: StateKnobs) -> tuple[str, ...]:
        """The knobs of k that differ from the user's and need a code edit of the framework."""
        return tuple(n for n in self.opts["edited"] if getattr(k, n) != getattr(self.bk, n))

    def family(self, k: StateKnobs) -> tuple:
        return family(k) + (bool(self.edited(k)), k.ref_offload or k.reward_offload, k.vllm_sleep,
                             k.deepspeed_sleep)

    def feasible(self, k: StateKnobs) -> bool:
        """Could anything fit with these model-state knobs? (tried with the least-memory activations)"""
        for loss in self.losses:
            tried = []
            for host in (False, True):
                act = least_memory(self.acts, loss, host)
                low = self.build(k, act) if act and act not in tried else None
                if low is None:
                    continue
                tried.append(act)
                verdict = self.estimate(low).verdict
                if verdict in FITTING:
                    return True
                if verdict in ("oom", "tight"):
                    break  # the host-friendly setting needs more device memory still
        return False

    def upper_bound(self, k: StateKnobs) -> float:
        """tokens/s of the fastest activation setting: nothing with these model-state knobs is faster."""
        fastest_acts = [a for a in (fastest(self.acts, loss) for loss in self.losses) if a is not None]
        speeds = [c.speed.tokens_per_second for c in (self.build(k, a) for a in fastest_acts) if c is not None]
        return max(speeds, default=0.0)

    def best_for(self, k: StateKnobs, floor: float = 0.0) -> Candidate | None:
        """The fastest fitting activation setting for these model-state knobs (None below `floor` tokens/s);
        among those it ties with (the measured tie band), the one with the fewest changes."""
        cands = [c for c in (self.build(k, a) for a in self.acts) if c is not None]
        n_state = len(changed(self.bk, k))

        def n_changes(c: Candidate) -> int:
            return n_state + len(changed(self.ak, c.act))

        cands.sort(key=lambda c: (-c.speed.tokens_per_second, n_changes(c)))
        out_of_memory: list[ActKnobs] = []
        best: Candidate | None = None
        fastest = 0.0  # the first fit's tokens/s: ties are against it, not against a slower simpler pick
        for c in cands:
            speed = c.speed.tokens_per_second
            if speed < floor or (best is not None and speed < fastest * (1 - tie_band())):
                break
            if best is not None and n_changes(c) >= n_changes(best):
                continue
            if any(le(o, c.act) for o in out_of_memory):
                continue
            e = self.estimate(c)
            if e.verdict in ("oom", "tight"):  # short of the card or of its error band: more memory is too
                out_of_memory.append(c.act)
            elif fits(e):
                fastest = fastest or speed
                best = c  # the first fit, or one that ties with it with fewer changes
        return best

    def late(self) -> bool:
        """The budget of estimates is spent: a count, not a clock, so a loaded machine gets the same plan."""
        self.cut_short = self.cut_short or self.estimates >= self.options.estimates_allowed()
        return self.cut_short


def family(k: StateKnobs) -> tuple:
    """Rows are one per approach: tuning, how the weights are laid out, what is offloaded. Optimizer,
    pin_memory and ratio variants of one approach compete for its row."""
    adapters = trains_adapters(k.tuning)
    if k.sharding.level == Sharding.NONE:
        layout = "replicated"
    elif adapters:  # adapter states are tiny: only sharding the frozen weights makes a difference
        layout = "sharded" if k.sharding.level == Sharding.PARAMETERS else "replicated"
    else:
        layout = str(k.sharding)
    return k.tuning, layout, k.offload != "none", k.offload_param != "none"


class Ranking:
    """Candidates (the best of each model-state setting) -> rows."""

    def __init__(self, bk: StateKnobs, ak: ActKnobs, top_k: int, family=family):
        self.bk, self.ak, self.top_k, self.family = bk, ak, top_k, family
        self.found: list[Candidate] = []
        self.rows: list[Candidate] = []

    def changes(self, c: Candidate) -> frozenset:
        return frozenset((n, getattr(c.state, n)) for n in changed(self.bk, c.state)) | frozenset(
            (n, getattr(c.act, n)) for n in changed(self.ak, c.act))

    def add(self, c: Candidate) -> None:
        self.found.append(c)
        self.rows = self._rank()

    def _rank(self) -> list[Candidate]:
        families: dict[tuple, list[Candidate]] = {}
        for c in self.found:
            families.setdefault(self.family(c.state), []).append(c)
        best = [self._simplest(members) for members in families.values()]
        sets = {id(c): self.changes(c) for c in self.found}
        kept = [c for c in best if not any(self._redundant(c, sets[id(c)], o, sets[id(o)])
                                           for o in self.found if o is not c)]
        return tie_order(kept, lambda c: len(sets[id(c)]))[: self.top_k]

    def _simplest(self, members: list[Candidate]) -> Candidate:
        """The fewest changes among the members that tie with the fastest."""
        fastest = max(c.speed.tokens_per_second for c in members)
        close = [c for c in members if c.speed.tokens_per_second >= fastest * (1 - tie_band())]
        return min(close, key=lambda c: (len(self.changes(c)), -_margin(c), -c.speed.tokens_per_second))

    @staticmethod
    def _redundant(c: Candidate, mine: frozenset, other: Candidate, theirs: frozenset) -> bool:
        """c makes all of `other`'s changes and more, and the extra ones buy neither speed nor memory."""
        if not theirs < mine or other.speed.tokens_per_second < c.speed.tokens_per_second * (1 - tie_band()):
            return False
        hw = c.scenario.hardware
        e, o = c.judged, other.judged
        assert e is not None and o is not None, "only estimated candidates are compared"
        device_gain = o.device_peak - e.device_peak
        host_gain = o.host_peak - e.host_peak
        return device_gain < MEMORY_TOLERANCE * hw.gpu.memory_bytes and (
            hw.host_ram is None or host_gain < MEMORY_TOLERANCE * hw.host_ram)

    def floor(self, k: StateKnobs) -> float:
        """Below this many tokens/s a candidate with these knobs can change no row: its approach already has a
        faster one, or k rows are faster. Slower by less than the tie band it still can, by as few changes or
        fewer (the tie's order), but not when these knobs alone already make more changes than the row it
        would have to pass."""
        n = len(changed(self.bk, k))
        mine = self.family(k)
        members = [c for c in self.found if self.family(c.state) == mine]
        fastest = max((c.speed.tokens_per_second for c in members), default=0.0)
        simpler = bool(members) and n <= len(self.changes(self._simplest(members)))  # could be its approach's row
        family = fastest * (1 - tie_band()) if simpler else fastest
        last = 0.0
        if len(self.rows) >= self.top_k:
            row = self.rows[-1]
            tied = simpler or n <= len(self.changes(row))
            last = row.speed.tokens_per_second * ((1 - tie_band()) if tied else 1)
        return max(family, last)

    def done(self, bound: float) -> bool:
        """No candidate at most `bound` tokens/s can still enter the rows."""
        if len(self.rows) < self.top_k:
            return False
        return bound < self.rows[-1].speed.tokens_per_second * (1 - tie_band())


def _margin(c: Candidate) -> int:
    return c.judged.margin if c.judged is not None else 0


def tie_groups(speeds: list[float]) -> list[int]:
    """Speeds sorted fastest first -> the tie group of each: a group is a fastest speed and every speed that
    ties with it (planner/throughput.py `tie_band`)."""
    groups: list[int] = []
    leader: float | None = None
    for v in speeds:
        if leader is None or v < leader * (1 - tie_band()):
            leader = v
            groups.append(len(groups) and groups[-1] + 1)
        else:
            groups.append(groups[-1])
    return groups


def tie_order(cands: list[Candidate], n_changes) -> list[Candidate]:
    """Fastest first, but inside a tie the fewest changes first, then the most memory margin."""
    fastest = sorted(cands, key=lambda c: -c.speed.tokens_per_second)
    groups = tie_groups([c.speed.tokens_per_second for c in fastest])
    ranked = sorted(zip(groups, fastest), key=lambda gc: (gc[0], n_changes(gc[1]), -_margin(gc[1]),
                                                          -gc[1].speed.tokens_per_second))
    return [c for _, c in ranked]


def run_search(base: Scenario, allow: set[str], global_batch: int | None, top_k: int,
            options: Options, keep: Keep = Keep()) -> tuple[Search, list]:
    search = Search(base, allow, global_batch, options, keep)
    bounded = sorted(((search.upper_bound(k), k) for k in search.states), key=lambda x: -x[0])
    ranking = Ranking(search.bk, search.ak, top_k, search.family)
    for bound, k in bounded:
        if ranking.done(bound) or search.late():
            break
        floor = ranking.floor(k)
        if bound < floor or not search.feasible(k):
            continue
        best = search.best_for(k, floor)
        if best is not None:
            ranking.add(best)
    return search, ranking.rows
