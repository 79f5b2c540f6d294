r"""A self-play play phase, lock-step vs overlapped rollouts, in one run.

  .venv/bin/python -m experiments.benchmarks.rollout [--models=tiny,50m] [--episodes=24] \
      [--slots=24] [--turns=6] [--turn_tokens=48] [--step_ms=5[,50,...]] [--repeats=3]

Plays `--episodes` multi-turn episodes through `selfplay.run_episodes` with a real sandbox
pool and a Sampler (temperature 1, a set of stop ids so that turns end at different
lengths, as a model's turns do). Every env step sleeps `--step_ms` inside the sandbox
worker, standing for env work (a list times one row per step time: how much env time the
overlapped schedule hides; the design-ahead comparison and the split use the first). The
lock-step schedule decodes every running episode's turn, then steps every env; the
overlapped one steps an episode's env as soon as its turn ends, in a worker thread, while
the engine decodes the others. Rounds alternate between the two
schedules; the script prints min/median seconds of each, the speed-up, and whether both
produced the same transcripts (tokens, outcomes, log-probs within 1e-4) on every round, with
the ids and the largest log-prob gap shown apart (on a GPU, products in other shapes can
round differently, so log-probs can drift while the ids hold).
Each step time gets one untimed round of each schedule first. The overlapped schedule's
extend and decode shapes depend on when env steps return, so a timed round can still meet
a shape not compiled yet: the rows count the XLA compilations inside timed rounds
(`compiles`), which a steady-state comparison needs at 0. `--cohorts=2,3` also times
overlapped play in that many out-of-phase lock-step cohorts of rows (same transcripts).
With --split it also plays one more round of each, untimed, and prints the seconds spent in engine
extends and decode calls, their counts and the decode steps run: overlap saves decode steps
(stragglers), while extends cost the same work either way.

With --designs=D (> 0) it also times `selfplay.design_ahead`'s play phase: the same plays
followed by D one-shot designer generations (--design_prompt prompt ids, --design_tokens
new tokens; the reference order, the designs drawn after the plays) against the plays with
the D generations decoded on the same engine rows (`run_episodes_with_requests`), each with
lock-step and overlapped plays, and checks that all four give the same transcripts and the
same designs. That comparison samples with stops 1 in --design_stop_every ids (rare: a
program runs long), so its plays' turns mostly run to their budget.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

from experiments.benchmarks.common import model_config

_MODELS = flags.DEFINE_list("models", ["tiny", "50m"], "Model sizes: tiny, 50m.")
_EPISODES = flags.DEFINE_integer("episodes", 24, "Episodes per play phase.")
_SLOTS = flags.DEFINE_integer("slots", 24, "Engine rows (episodes beyond wait for a row).")
_TURNS = flags.DEFINE_integer("turns", 6, "Turns per episode.")
_TURN_TOKENS = flags.DEFINE_integer("turn_tokens", 48, "New tokens per turn at most.")
_STEP_MS = flags.DEFINE_list("step_ms", ["5"], "Milliseconds each env step takes; a list "
                             "times one row per value.")
_COHORTS = flags.DEFINE_list("cohorts", [], "Also time overlapped play in k out-of-phase "
                             "lock-step cohorts of rows (`schedule(overlap=k)`), per k >= 2.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds per schedule.")
_MAX_LEN = flags.DEFINE_integer("max_len", 1024, "Transcript token budget per episode.")
_STOP_EVERY = flags.DEFINE_integer("stop_every", 12, "Every n-th id is a stop id (turns and "
                                   "designs end after ~n tokens; raise it for long designs).")
_DESIGNS = flags.DEFINE_integer("designs", 8, "Designer generations for the design-ahead "
                                "comparison (0: skip it).")
_DESIGN_PROMPT = flags.DEFINE_integer("design_prompt", 512, "Prompt ids per design.")
_DESIGN_TOKENS = flags.DEFINE_integer("design_tokens", 512, "New tokens per design at most.")
_DESIGN_STOP_EVERY = flags.DEFINE_integer(
    "design_stop_every", 1000, "--stop_every of the design-ahead comparison (plays and "
    "designs share the engine's rule; a program is long, so stops are rare by default).")
_DECODE_SUBSET = flags.DEFINE_bool(
    "decode_subset", True, "Engines decode only the active rows when they fit a smaller "
    "power of two (`Engine(decode_subset=)`); --nodecode_subset decodes every row.")
_GROUP_EXTENDS = flags.DEFINE_bool(
    "group_extends", True, "Engines split an extend into calls over rows with chunks of "
    "about the same length (`Engine(group_extends=)`); --nogroup_extends pads every row to "
    "the longest chunk.")
_PLATFORM = flags.DEFINE_string("platform", "cpu", "JAX platform to run on (\"\": JAX's "
                                 "default, e.g. the GPU).")
_SPLIT = flags.DEFINE_bool("split", True, "Also print where one more round of each schedule "
                           "spends its time (engine extends, decode calls and steps).")

# An env whose step takes a set time; observations of varying length; it never ends early.
PROGRAM = """
import random
import time


class SlowEnv:
  def __init__(self, max_turns=25, step_ms=5.0, **kwargs):
    self.max_turns, self.step_s = max_turns, step_ms / 1000.0

  def reset(self, seed=None, options=None):
    self.rng, self.t = random.Random(seed), 0
    return "Start: " + "x " * self.rng.randint(5, 40), {}

  def step(self, action):
    time.sleep(self.step_s)
    self.t += 1
    return ("obs " + "y " * self.rng.randint(2, 20), 0.0, False,
            self.t >= self.max_turns, {})
"""


class _Bytes:
  """Byte ids offset by 3 (0 pad, 1 EOS); larger ids of the random models wrap around."""

  eos_id, pad_id = 1, 0

  def encode(self, text):
    return [b + 3 for b in text.encode()]

  def decode(self, ids):
    return bytes((i - 3) % 256 for i in ids if i >= 3).decode(errors="replace")


class _Split:
  """Times `Engine.extend` / `Engine.decode` calls and counts decode steps."""

  def __init__(self):
    from spade_jax.sampling import engine as engine_lib  # pylint: disable=g-import-not-at-top
    self.stats = {}
    self.active = False
    for name in ("extend", "decode"):
      self._wrap(engine_lib.Engine, name)

  def _wrap(self, cls, name):
    import jax  # pylint: disable=g-import-not-at-top
    inner = getattr(cls, name)
    stats = self.stats

    def timed(eng, *args, **kwargs):
      if not self.active:
        return inner(eng, *args, **kwargs)
      before = list(eng.extend_positions)
      t0 = time.perf_counter()
      out = inner(eng, *args, **kwargs)
      if name == "extend":
        jax.block_until_ready(eng.state.logits)
        pos = stats.setdefault("positions", [0, 0])
        for k in (0, 1):  # this call's real tokens and computed token positions
          pos[k] += eng.extend_positions[k] - before[k]
      s = stats.setdefault(name, [0, 0.0, 0])
      s[0] += 1
      s[1] += time.perf_counter() - t0
      if name == "decode":  # the call's steps: its longest row's tokens
        s[2] += max((len(o[0]) for o in out.values()), default=0)
      return out

    setattr(cls, name, timed)

  def reset(self):
    self.stats.clear()

  def line(self) -> str:
    e = self.stats.get("extend", [0, 0.0, 0])
    d = self.stats.get("decode", [0, 0.0, 0])
    real, computed = self.stats.get("positions", [0, 0])
    return (f"extend {e[1]:.2f}s in {e[0]} calls ({real}/{computed} positions real), "
            f"decode {d[1]:.2f}s in {d[0]} calls / {d[2]} steps")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  from spade_jax.models import ChatTemplate, init_params  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Sampler, SamplingConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.sandbox import EnvPool, SandboxConfig  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Request, row_keys  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.episodes import (EpisodeSpec, run_episodes,  # pylint: disable=g-import-not-at-top
                                           run_episodes_with_requests)
  if _PLATFORM.value:
    jax.config.update("jax_platforms", _PLATFORM.value)
  from spade_jax.sampling import engine as engine_lib  # pylint: disable=g-import-not-at-top
  engine_lib.Engine.__init__.__kwdefaults__["decode_subset"] = _DECODE_SUBSET.value
  engine_lib.Engine.__init__.__kwdefaults__["group_extends"] = _GROUP_EXTENDS.value
  split = _Split() if _SPLIT.value else None
  chat = ChatTemplate(_Bytes())
  specs = [EpisodeSpec(0, s) for s in range(_EPISODES.value)]
  compiles = [0, 0.0]  # XLA compilations and their seconds, counted while `timing`
  timing = [False]

  def on_event(event, secs, **_):
    if timing[0] and event == "/jax/core/compile/backend_compile_duration":
      compiles[0] += 1
      compiles[1] += secs

  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    step_ms = [float(v) for v in _STEP_MS.value]
  except ValueError as e:
    raise app.UsageError(f"--step_ms takes numbers of milliseconds, got {_STEP_MS.value}") from e
  if not step_ms or min(step_ms) < 0:
    raise app.UsageError(f"--step_ms needs values >= 0, got {_STEP_MS.value}")
  try:
    cohorts = [int(v) for v in _COHORTS.value]
  except ValueError as e:
    raise app.UsageError(f"--cohorts takes integers >= 2, got {_COHORTS.value}") from e
  if any(k < 2 for k in cohorts):
    raise app.UsageError(f"--cohorts takes integers >= 2, got {_COHORTS.value}")
  sources = [PROGRAM.replace("step_ms=5.0", f"step_ms={ms}") for ms in step_ms]
  source = sources[0]
  with EnvPool(SandboxConfig(num_workers=min(8, _EPISODES.value))) as pool:
    for size in _MODELS.value:
      cfg = model_config(size)
      params = init_params(jax.random.key(0), cfg)
      # ~1 in --stop_every draws is a stop id: turns end at different lengths.
      rule = SamplingConfig(temperature=1.0, eos_id=1,
                            eos_ids=tuple(range(3, cfg.vocab_size, _STOP_EVERY.value)),
                            pad_id=0)

      def play(overlap, source=source):
        sampler = Sampler(params, cfg, rule, jax.random.key(7))
        t0 = time.perf_counter()
        eps = run_episodes(pool, [source], specs, sampler, chat, "Play.",
                           max_turns=_TURNS.value, max_turn_tokens=_TURN_TOKENS.value,
                           max_len=_MAX_LEN.value, max_slots=_SLOTS.value, overlap=overlap)
        return time.perf_counter() - t0, eps

      kinds = [False, True, *cohorts]
      for ms, src in zip(step_ms, sources):
        for o in kinds:  # compile each schedule's shapes at this step time
          play(o, src)
        times = {o: [] for o in kinds}
        same_ids, dlogp = True, 0.0
        compiles[:] = [0, 0.0]
        timing[0] = True
        for _ in range(_REPEATS.value):
          got = {}
          for o in kinds:
            times[o].append(0.0)
            times[o][-1], got[o] = play(o, src)
          a = got[False]
          same_ids &= all(x.tokens == y.tokens and x.outcome == y.outcome and x.turns == y.turns
                          for b in got.values() for x, y in zip(a, b))
          dlogp = max([dlogp, *(abs(p - q) for b in got.values() for x, y in zip(a, b)
                                for p, q in zip(x.logps, y.logps))])
        same = same_ids and dlogp < 1e-4
        timing[0] = False
        seq, ovl = statistics.median(times[False]), statistics.median(times[True])
        turns = sum(ep.turns for ep in a)
        print(f"{size:5s} {_EPISODES.value} episodes x {_TURNS.value} turns ({turns} turns, "
              f"{ms:g} ms steps, {_SLOTS.value} rows): lock-step "
              f"{min(times[False]):.2f}/{seq:.2f}s  overlapped "
              f"{min(times[True]):.2f}/{ovl:.2f}s (min/median)  speed-up {seq / ovl:.2f}x  "
              f"same transcripts {same} (ids {same_ids}, max |d log-prob| {dlogp:.1e})  "
              f"compiles {compiles[0]} ({compiles[1]:.2f}s)",
              flush=True)
        for k in cohorts:
          med = statistics.median(times[k])
          print(f"      {k} cohorts: {min(times[k]):.2f}/{med:.2f}s (min/median)  "
                f"speed-up {seq / med:.2f}x", flush=True)
      if _DESIGNS.value > 0:
        rule = SamplingConfig(temperature=1.0, eos_id=1, pad_id=0, eos_ids=tuple(
            range(3, cfg.vocab_size, _DESIGN_STOP_EVERY.value)))
        prompts = [[3 + (7 * d + 13 * i) % 250 for i in range(_DESIGN_PROMPT.value)]
                   for d in range(_DESIGNS.value)]
        kw = dict(max_turns=_TURNS.value, max_turn_tokens=_TURN_TOKENS.value,
                  max_len=_MAX_LEN.value)

        def then_design(overlap):  # the reference order: plays, then the designs
          agent, designer = (Sampler(params, cfg, rule, jax.random.key(7)),
                             Sampler(params, cfg, rule, jax.random.key(8)))
          t0 = time.perf_counter()
          eps = run_episodes(pool, [source], specs, agent, chat, "Play.", **kw,
                             max_slots=_SLOTS.value, overlap=overlap)
          gen = designer(prompts, _DESIGN_TOKENS.value)
          return time.perf_counter() - t0, eps, gen.tokens

        def together(overlap):  # design ahead: the designs on the plays' engine rows
          agent = Sampler(params, cfg, rule, jax.random.key(7))
          key = jax.random.fold_in(jax.random.key(8), 0)  # the designer's call 0
          reqs = [Request(p, _DESIGN_TOKENS.value, k)
                  for p, k in zip(prompts, row_keys(key, len(prompts)))]
          t0 = time.perf_counter()
          eps, done = run_episodes_with_requests(pool, [source], specs, agent, chat, "Play.",
                                                 reqs, **kw, overlap=overlap,
                                                 max_slots=_SLOTS.value + len(prompts))
          return time.perf_counter() - t0, eps, [c.tokens for c in done]

        runs = {"then": lambda o: then_design(o), "with": lambda o: together(o)}
        for o in (False, True):  # compile
          runs["then"](o), runs["with"](o)
        dt = {(k, o): [] for k in runs for o in (False, True)}
        same = True
        for _ in range(_REPEATS.value):
          got = {}
          for k, o in dt:  # interleaved rounds
            t, eps, gen = runs[k](o)
            dt[k, o].append(t)
            got[k, o] = (eps, gen)
          ref_eps, ref_gen = got["then", False]
          same &= all(gen == ref_gen and all(x.tokens == y.tokens and x.outcome == y.outcome
                                             for x, y in zip(ref_eps, eps))
                      for eps, gen in got.values())
        med = {k: statistics.median(v) for k, v in dt.items()}
        tokens = sum(map(len, ref_gen))
        for o in (False, True):
          name = "overlapped" if o else "lock-step "
          print(f"      design ahead ({name} plays), {len(prompts)} designs x "
                f"{_DESIGN_PROMPT.value}+{_DESIGN_TOKENS.value} ids ({tokens} drawn): plays "
                f"then designs {min(dt['then', o]):.2f}/{med['then', o]:.2f}s, on the same "
                f"rows {min(dt['with', o]):.2f}/{med['with', o]:.2f}s (min/median)  speed-up "
                f"{med['then', o] / med['with', o]:.2f}x", flush=True)
        print(f"      same transcripts and designs in all four {same}", flush=True)
      if split:  # one more (untimed) round of each, with the engine calls timed
        for overlap in (False, True):
          split.reset()
          split.active = True
          play(overlap)
          split.active = False
          print(f"      {'overlapped' if overlap else 'lock-step '}: {split.line()}",
                flush=True)


if __name__ == "__main__":
  app.run(main)
