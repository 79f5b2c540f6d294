"""The warm start's starting levels, measured the way the arms play.

* agent: medium-level (level 2) episodes of every seen family through
  ``selfplay.run_episodes`` with the run's agent sampling (T 0.6, top-p 0.95, top-k 20) and
  greedily; the win rate is the fraction solved.
* designer: designer prompts (the run's renderer, corpus and budget, no memory) sampled at
  the run's designer sampling, validated by the run's validator; the valid rate, the rejection
  reasons and which families and difficulty levels the valid programs are.

Run alone, it measures a checkpoint's agent at every difficulty level:

  python -m experiments.mechanism.measure --hf=DIR [--families=a,b | --held_out]
      [--levels=0,1,2,3,4] [--episodes=40] [--temperature=0] [--show=0] [--json=PATH]
"""

from __future__ import annotations

import collections
import re
import time

import jax

from experiments.mechanism import common


def _sampling(vocab, temperature: float):
  from spade_jax.sampling import SamplingConfig  # pylint: disable=g-import-not-at-top
  return SamplingConfig(temperature=temperature, top_p=0.95 if temperature else 1.0,
                        top_k=20 if temperature else 0, eos_id=vocab.eos_id,
                        pad_id=vocab.pad_id)


def family_of(source: str) -> tuple[str | None, int | None]:
  """(family, mean difficulty level of its knobs) of a program written from a family.

  The family is the one whose title starts the program; the level is the mean over knobs of
  the level whose value is closest to the knob constant the program sets.
  """
  from spade_jax.envs.families import FAMILIES  # pylint: disable=g-import-not-at-top
  for fam in FAMILIES.values():
    if source.lstrip().startswith(f'"""{fam.title}"""'):
      levels = []
      for k in fam.knobs:
        m = re.search(rf"^{k.name} = (-?\d+)", source, re.M)
        if m:
          v = int(m.group(1))
          levels.append(min(range(len(k.levels)), key=lambda i: (abs(k.levels[i] - v), i)))
      return fam.name, (sum(levels) / len(levels) if levels else None)
  return None, None


def transcript(vocab, ids, end: str = "<|im_end|>") -> str:
  """The whole text of an episode's ids (``vocab.decode`` stops at the first end of turn)."""
  parts, cur = [], []
  for i in ids:
    if int(i) == vocab.eos_id:
      parts.append(vocab.decode(cur))
      cur = []
    else:
      cur.append(int(i))
  return end.join(parts + [vocab.decode(cur)])


def agent_win_rate(pool, params, cfg, chat, *, families, level: int, episodes: int,
                   temperature: float, seed: int = 0, max_slots: int = 32,
                   keep: int = 0) -> dict:
  """Win rate of the policy on ``episodes`` episodes per family at ``level``; ``keep``: the
  text of that many episodes per family is returned too (``transcripts``)."""
  from spade_jax import designer as dz  # pylint: disable=g-import-not-at-top
  from spade_jax.envs.families import FAMILIES  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Sampler  # pylint: disable=g-import-not-at-top
  from spade_jax.selfplay.episodes import EpisodeSpec, run_episodes  # pylint: disable=g-import-not-at-top
  sources = [FAMILIES[f].program_at(level) for f in families]
  specs = [EpisodeSpec(e, 20_000 + seed * 1000 + i) for e in range(len(families))
           for i in range(episodes)]
  sampler = Sampler(params, cfg, _sampling(chat.vocab, temperature), jax.random.key(seed))
  eps = run_episodes(pool, sources, specs, sampler, chat, dz.agent_system_prompt("games"),
                     max_turns=common.MAX_TURNS, max_turn_tokens=common.AGENT_TURN_TOKENS,
                     max_len=3072, max_slots=max_slots)
  per = collections.defaultdict(list)
  for ep in eps:
    per[families[ep.spec.env]].append(ep.solved)
  out = {"win_rate": sum(ep.solved for ep in eps) / len(eps),
         "per_family": {f: sum(v) / len(v) for f, v in per.items()},
         "outcomes": dict(collections.Counter(ep.outcome for ep in eps))}
  if keep:
    shown = collections.Counter()
    out["transcripts"] = []
    for ep in eps:
      fam = families[ep.spec.env]
      if shown[fam] < keep:
        shown[fam] += 1
        out["transcripts"].append({"family": fam, "outcome": ep.outcome,
                                   "text": transcript(chat.vocab, ep.tokens)})
  return out


def designer_valid_rate(pool, params, cfg, chat, *, designs: int, seed: int = 0,
                        max_new_tokens: int = 1400) -> dict:
  """Valid rate of ``designs`` designer samples at the run's designer sampling."""
  from spade_jax import designer as dz  # pylint: disable=g-import-not-at-top
  from spade_jax import envs  # pylint: disable=g-import-not-at-top
  from spade_jax.sampling import Sampler  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import data  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  skills = common.skills()
  count = lambda t: len(chat.prompt(None, t))
  with tempfile.TemporaryDirectory(prefix="mech_measure_") as corpus_dir:
    corpus = data.corpus(corpus_dir, seed=1234 + seed)
    prompts = [chat.prompt(None, dz.designer_prompt(
        common.SETTING, skills[i % len(skills)], corpus.next(),
        budget=common.DESIGNER_PROMPT_TOKENS, count=count)) for i in range(designs)]
  sampler = Sampler(params, cfg, _sampling(chat.vocab, 0.6), jax.random.key(seed))
  gen = sampler(prompts, max_new_tokens)
  texts = [chat.vocab.decode(t) for t in gen.tokens]
  verdicts = envs.validate_many(texts, pool, envs.ValidationConfig(
      max_turns=common.MAX_TURNS, setting=common.SETTING))
  reasons = collections.Counter(v.reason for v in verdicts if not v.valid)
  fams = collections.Counter()
  levels = []
  for v in verdicts:
    if v.valid:
      name, level = family_of(v.source)
      fams[name or "other"] += 1
      if level is not None:
        levels.append(level)
  return {"valid_rate": sum(v.valid for v in verdicts) / len(verdicts),
          "rejected": dict(reasons), "families": dict(fams),
          "mean_level": sum(levels) / len(levels) if levels else None,
          "finished_rate": sum(gen.finished) / len(gen.finished)}


def by_level(hf_dir: str, *, levels, episodes: int, temperature: float = 0.0,
             families=(), keep: int = 0) -> dict:
  """The agent's win rate at each of ``levels`` ({level: agent_win_rate's dict})."""
  from spade_jax import models, sandbox  # pylint: disable=g-import-not-at-top
  from spade_jax.envs.families import FAMILIES  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  families = tuple(families) or common.seen()
  top = min(len(FAMILIES[f].knobs[0].levels) for f in families) - 1
  bad = [lv for lv in levels if not 0 <= lv <= top]
  if bad:
    raise ValueError(f"levels {bad}: the families have levels 0..{top}.")
  params, cfg = models.load_hf(hf_dir)
  chat = models.ChatTemplate(load_tokenizer(hf_dir), thinking=False)
  with sandbox.EnvPool(sandbox.SandboxConfig()) as pool:
    return {lv: agent_win_rate(pool, params, cfg, chat, families=families, level=lv,
                               episodes=episodes, temperature=temperature, keep=keep)
            for lv in levels}


def starting_levels(hf_dir: str, *, episodes: int, designs: int, families=()) -> dict:
  """Loads ``hf_dir`` and measures the agent and the designer (see the module docstring);
  ``families``: the agent's families (default: every seen family)."""
  from spade_jax import models, sandbox  # pylint: disable=g-import-not-at-top
  from spade_jax.models.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  params, cfg = models.load_hf(hf_dir)
  chat = models.ChatTemplate(load_tokenizer(hf_dir), thinking=False)
  families = tuple(families) or common.seen()
  with sandbox.EnvPool(sandbox.SandboxConfig()) as pool:
    out = {
        "agent_medium_sampled": agent_win_rate(pool, params, cfg, chat,
                                               families=families, level=2,
                                               episodes=episodes, temperature=0.6),
        "agent_medium_greedy": agent_win_rate(pool, params, cfg, chat,
                                              families=families, level=2,
                                              episodes=episodes, temperature=0.0),
    }
    if designs:  # 0: an agent-only build (no designer rows to measure)
      out["designer"] = designer_valid_rate(pool, params, cfg, chat, designs=designs)
  out["params"] = int(sum(x.size for x in jax.tree.leaves(params)))
  out["seconds"] = time.time() - t0
  return out


def main(argv):
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from experiments.mechanism import warm_start  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not os.path.isfile(os.path.join(_HF.value, "config.json")):
    raise app.UsageError(f"--hf={_HF.value!r}: not an HF checkpoint directory (a warm "
                         "start's hf/).")
  try:
    levels = [int(x) for x in _LEVELS.value.split(",") if x.strip()]
  except ValueError as e:
    raise app.UsageError(f"--levels={_LEVELS.value!r}: expected integers like 0,1,2") from e
  if _HELD_OUT.value and _FAMILIES.value:
    raise app.UsageError("--held_out measures the held-out family alone; drop --families.")
  families = ((common.HELD_OUT,) if _HELD_OUT.value
              else warm_start.parse_families(_FAMILIES.value))
  t0 = time.time()
  res = by_level(_HF.value, levels=levels, episodes=_EPISODES.value,
                 temperature=_TEMPERATURE.value, families=families, keep=_SHOW.value)
  for lv, r in res.items():
    for t in r.get("transcripts", []):
      print(f"--- level {lv}, {t['family']}, {t['outcome']} ---\n{t['text']}")
    per = ", ".join(f"{f} {w:.2f}" for f, w in sorted(r["per_family"].items()))
    print(f"level {lv}: win rate {r['win_rate']:.3f} ({per})")
  print(f"{time.time() - t0:.0f} s")
  if _JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w") as f:
      json.dump({"hf": _HF.value, "episodes": _EPISODES.value,
                 "temperature": _TEMPERATURE.value,
                 "levels": {str(k): v for k, v in res.items()}}, f, indent=1)


if __name__ == "__main__":
  from absl import app as _app  # pylint: disable=g-import-not-at-top
  from absl import flags as _flags  # pylint: disable=g-import-not-at-top
  _HF = _flags.DEFINE_string("hf", "", "An HF checkpoint directory (a warm start's hf/).")
  _FAMILIES = _flags.DEFINE_string("families", "", "Seen families, comma-separated "
                                   "(default: all).")
  _HELD_OUT = _flags.DEFINE_bool("held_out", False, "Measure the held-out family (never "
                                 "trained on) instead of the seen ones.")
  _LEVELS = _flags.DEFINE_string("levels", "0,1,2,3,4", "Difficulty levels, comma-separated.")
  _EPISODES = _flags.DEFINE_integer("episodes", 40, "Episodes per family per level.")
  _TEMPERATURE = _flags.DEFINE_float("temperature", 0.0, "0: greedy.")
  _JSON = _flags.DEFINE_string("json", "", "Also write the figures to this JSON file.")
  _SHOW = _flags.DEFINE_integer("show", 0, "Print (and keep in the JSON) the text of this "
                                "many episodes per family per level.")
  _app.run(main)
