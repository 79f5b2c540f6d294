r"""Reasoning Gym: procedural tasks (``reasoning-gym`` package, offline), hard settings.

Four groups, as the paper reports them: ``math`` (the package's algebra, arithmetic,
geometry and probability tasks), ``algorithmic``, ``cognition`` and ``logic`` (its modules
of those names). A group's ``tasks`` items go round-robin over its datasets (sorted by
name), each dataset generated with a fixed seed at the settings of :data:`HARD`, so every
run sees the same tasks. Each task is played ``samples`` times (the paper: 100 tasks x 8
episodes); the answer is the completion's last ``\boxed{}`` (``<answer>`` if it has
none, see ``answers``), scored by the dataset's own ``score_answer``.

Scores: ``<group>`` is the win rate (episodes scored 1.0), ``<group>/score`` the mean
score (some scorers give partial credit), ``win_rate`` the mean over groups.
"""

from __future__ import annotations

import dataclasses
import math

from spade_jax.eval import answers
from spade_jax.eval.core import SuiteConfig, SuiteResult, mean, need, register
from spade_jax.eval.policy import texts
from spade_jax.registry import Registry

# Group -> the reasoning_gym modules whose datasets it holds.
GROUPS = Registry("reasoning gym group", {
    "math": ("algebra", "arithmetic", "geometry", "probability"),
    "algorithmic": ("algorithmic",),
    "cognition": ("cognition",),
    "logic": ("logic",),
}, field="reasoning_gym.groups")

# Hard settings per dataset: the harder of the two parameter sets of reasoning-gym's
# published evaluation configs (its repository's eval/yaml), adapted to this version's
# config fields; datasets not listed run at the package defaults. `jugs` and
# `palindrome_partitioning` are smaller than there: at those sizes generating one task
# takes 30+ seconds.
HARD = {
    "complex_arithmetic": dict(min_real=-100, max_real=100, min_imag=-100, max_imag=100,
                               operations_weights=[0.25, 0.25, 0.25, 0.25]),
    "intermediate_integration": dict(problem_type_weights=[0, 0, 0, 1, 0, 0, 0, 0]),
    "polynomial_equations": dict(min_degree=2, max_degree=3, min_terms=3, max_terms=4),
    "polynomial_multiplication": dict(min_terms=4, max_terms=8, min_value=10, max_value=10000,
                                      min_degree=1, max_degree=4, min_polynomials=3,
                                      max_polynomials=6),
    "simple_equations": dict(min_terms=3, max_terms=10, min_value=10, max_value=10000,
                             operators_weights=[0.35, 0.35, 0.3]),
    "simple_integration": dict(min_terms=3, max_terms=4),
    "basic_arithmetic": dict(min_terms=5, max_terms=10, min_digits=2, max_digits=5),
    "bitwise_arithmetic": dict(difficulty=5),
    "chain_sum": dict(min_terms=5, max_terms=8, min_digits=4, max_digits=6),
    "count_bits": dict(min_n=1000000, max_n=100000000),
    "decimal_arithmetic": dict(min_num_decimal_places=5, max_num_decimal_places=8,
                               precision=10, min_terms=5, max_terms=8),
    "decimal_chain_sum": dict(min_terms=5, max_terms=8, min_digits=4, max_digits=8,
                              min_decimal_places=4, max_decimal_places=6),
    "dice": dict(num_dice=6, max_dice_size=25),
    "fraction_simplification": dict(min_value=100, max_value=1000, min_factor=10,
                                    max_factor=100),
    "gcd": dict(min_numbers=3, max_numbers=4, min_value=1000, max_value=10000),
    "lcm": dict(min_numbers=3, max_numbers=4, min_value=1000, max_value=10000),
    "leg_counting": dict(min_animals=20, max_animals=30, min_instances=64, max_instances=256),
    "number_format": dict(min_num_candidates=25, max_num_candidates=100, min_n=100000,
                          max_n=1000000, max_delta=0.001),
    "power_function": dict(min_exponent=4, max_exponent=8),
    "prime_factorization": dict(min_value=1000, max_value=5000),
    "products": dict(min_terms=4, max_terms=8, min_digits=4, max_digits=8),
    "time_intervals": dict(max_time_difference_seconds=21600, max_date_difference_days=30),
    "advanced_geometry": dict(min_coord=-100, max_coord=100),
    "simple_geometry": dict(min_sides=10, max_sides=15),
    "ab": dict(length=25),
    "base_conversion": dict(min_base=9, max_base=18, min_value=10000, max_value=100000),
    "binary_alternation": dict(min_n=50, max_n=500),
    "binary_matrix": dict(p_zero=0.25, min_n=25, max_n=50),
    "caesar_cipher": dict(min_rotation=15, max_rotation=25, min_words=15, max_words=25),
    "count_primes": dict(min_n=10000, max_n=50000),
    "cryptarithm": dict(min_words=5, max_words=10),
    "game_of_life": dict(grid_size_x=50, grid_size_y=50, filled_cells_weights=0.2,
                         simulation_steps=2),
    "game_of_life_halting": dict(grid_size_x=50, grid_size_y=50, difficulty=2,
                                 num_oscillators=7, max_simulation_steps=50),
    "graph_color": dict(min_num_vertices=10, max_num_vertices=20, num_colors=4),
    "group_anagrams": dict(min_anagram_groups=10, max_anagram_groups=50,
                           min_words_per_group=2, max_words_per_group=5),
    "isomorphic_strings": dict(min_string_length=50, max_string_length=100),
    "jugs": dict(num_jugs=4, difficulty=10),
    "letter_counting": dict(min_words=25, max_words=50),
    "letter_jumble": dict(min_word_len=5, max_word_len=30, min_words=25, max_words=50,
                          min_corruption_level=0.5, max_corruption_level=0.5),
    "manipulate_matrix": dict(min_rows=25, max_rows=50, min_cols=25, max_cols=50,
                              min_transforms=3, max_transforms=10),
    "number_filtering": dict(min_numbers=50, max_numbers=100, min_decimals=2, max_decimals=4,
                             min_value=-500, max_value=500),
    "number_sorting": dict(min_numbers=50, max_numbers=100, min_decimals=2, max_decimals=4,
                           min_value=-500, max_value=500),
    "palindrome_generation": dict(min_length=50, max_length=100),
    "palindrome_partitioning": dict(min_string_len=10, max_string_len=20,
                                    min_substring_palindrome_len=5,
                                    max_substring_palindrome_len=10),
    "pool_matrix": dict(min_rows=25, max_rows=50, min_cols=25, max_cols=50, min_pool_size=5,
                        max_pool_size=7),
    "ransom_note": dict(min_note_length=50, max_note_length=100, min_magazine_length=100,
                        max_magazine_length=500),
    "rotate_matrix": dict(min_n=25, max_n=50, min_rotations=5, max_rotations=15),
    "rotten_oranges": dict(min_n=25, max_n=50),
    "sentence_reordering": dict(min_words_in_sentence=20, max_words_in_sentence=50),
    "spell_backward": dict(min_word_len=5, max_word_len=20),
    "spiral_matrix": dict(min_n=25, max_n=50),
    "string_insertion": dict(min_string_length=50, max_string_length=100),
    "string_manipulation": dict(min_string_length=50, max_string_length=100),
    "string_splitting": dict(min_initial_machines=50, max_initial_machines=100),
    "string_synthesis": dict(min_initial_blocks=50, max_initial_blocks=100),
    "word_ladder": dict(min_word_length=3, max_word_length=5),
    "word_sequence_reversal": dict(min_words=25, max_words=50),
    "word_sorting": dict(min_words=25, max_words=50, min_word_length=5, max_word_length=10),
    "color_cube_rotation": dict(min_rotations=10, max_rotations=50),
    "figlet_font": dict(min_word_len=5, max_word_len=10),
    "modulo_grid": dict(size_x=40, size_y=40, max_holes=5, max_divisor=7, max_target=3),
    "needle_haystack": dict(min_num_statements=100, max_num_statements=500),
    "number_sequence": dict(min_terms=8, max_terms=12, min_value=-500, max_value=500,
                            max_complexity=3),
    "rectangle_count": dict(max_rectangles=15),
    "rubiks_cube": dict(cube_size=5, min_scramble_steps=25, max_scramble_steps=50),
    "aiw": dict(task_type_weights=[0.5, 0.25, 0.25], max_entities=10),
    "circuit_logic": dict(min_terms=10, max_terms=20, min_inputs=4, max_inputs=8),
    "knights_knaves": dict(n_people=3, depth_constraint=3, width_constraint=3),
    "propositional_logic": dict(min_vars=4, max_vars=8, min_statements=4, max_statements=8,
                                min_complexity=2, max_complexity=4),
    "self_reference": dict(difficulty=5),
    "syllogism": dict(allow_all=True, allow_no=True, allow_some=False, allow_some_not=False),
    "zebra_puzzles": dict(num_people=5, num_characteristics=5),
}
DIFFICULTIES = Registry("reasoning gym difficulty", {"hard": HARD, "default": {}},
                        field="reasoning_gym.difficulty")
PROMPT = "{question}\n\nPut your final answer within \\boxed{{}}."


@dataclasses.dataclass(frozen=True)
class ReasoningGymConfig(SuiteConfig):
  """``reasoning_gym``: 100 tasks x 8 episodes per group (docs/METHOD.md §8).

  ``limit`` caps the tasks per group (it wins over ``tasks`` when smaller). Sampling is the
  agent's self-play sampling (T 0.6, top-p 0.95, top-k 20): the paper gives none.

  Attributes:
    groups: which groups (keys of :data:`GROUPS`).
    tasks: tasks per group.
    difficulty: "hard" (:data:`HARD`) or "default" (the package's settings).
    data_seed: seed of the task generators (fixed: the same tasks in every run).
  """

  samples: int = 8
  temperature: float = 0.6
  top_p: float = 0.95
  top_k: int = 20
  max_new_tokens: int = 8192
  groups: tuple[str, ...] = ("math", "algorithmic", "cognition", "logic")
  tasks: int = 100
  difficulty: str = "hard"
  data_seed: int = 42

  def __post_init__(self):
    super().__post_init__()
    for g in self.groups:
      GROUPS.check(g)
    DIFFICULTIES.check(self.difficulty)


def group_datasets(group: str) -> list[str]:
  """The reasoning_gym dataset names of a group, sorted."""
  from reasoning_gym.factory import DATASETS  # pylint: disable=g-import-not-at-top
  modules = GROUPS[group]
  return sorted(name for name, (cls, _) in DATASETS.items()
                if cls.__module__.split(".")[1] in modules)


def tasks(group: str, n: int, difficulty: str = "hard", seed: int = 42) -> list[dict]:
  """The group's first ``n`` tasks: round-robin over its datasets.

  Returns:
    [{"id": "<dataset>/<index>", "dataset", "entry" (question, answer, metadata),
    "score" (the dataset's score_answer)}].
  """
  import reasoning_gym  # pylint: disable=g-import-not-at-top
  names = group_datasets(group)
  per = math.ceil(n / len(names))
  datasets = {}
  out = []
  for i in range(n):
    name, index = names[i % len(names)], i // len(names)
    if name not in datasets:
      params = DIFFICULTIES[difficulty].get(name, {})
      datasets[name] = reasoning_gym.create_dataset(name, size=per, seed=seed, **params)
    ds = datasets[name]
    out.append({"id": f"{name}/{index}", "dataset": name, "entry": ds[index],
                "score": ds.score_answer})
  return out


def score(task: dict, completion: str) -> tuple[float, str | None]:
  """(score in [0, 1], parsed answer) of one completion of a task."""
  answer, _ = answers.final_answer(completion)
  try:
    value = float(task["score"](answer, task["entry"]))
  except Exception:  # pylint: disable=broad-except  (a scorer choking on garbage scores 0)
    value = 0.0
  return min(1.0, max(0.0, value)), answer


@register("reasoning_gym", ReasoningGymConfig, needs="offline (procedural)",
          description="Reasoning Gym math/algorithmic/cognition/logic, hard, win rate",
          check=lambda cfg: need("reasoning_gym", "reasoning-gym", "reasoning_gym"))
def run_reasoning_gym(policy, chat, cfg: ReasoningGymConfig, *, pool=None, progress=None
                      ) -> SuiteResult:
  del pool
  n = min(cfg.tasks, cfg.limit) if cfg.limit else cfg.tasks
  items = [(g, t) for g in cfg.groups for t in tasks(g, n, cfg.difficulty, cfg.data_seed)]
  outs = texts(policy, chat, cfg, [PROMPT.format(question=t["entry"]["question"])
                                   for _, t in items], progress)
  records, wins, means = [], {g: [] for g in cfg.groups}, {g: [] for g in cfg.groups}
  for (group, task), samples in zip(items, outs):
    scored = [score(task, t) for t in samples]
    values = [s for s, _ in scored]
    wins[group] += [float(v >= 1.0) for v in values]
    means[group] += values
    records.append({"id": task["id"], "group": group,
                    "answer": task["entry"].get("answer"),
                    "predictions": [a for _, a in scored], "scores": values,
                    "win_rate": mean([float(v >= 1.0) for v in values]),
                    "texts": [cfg.clip(t) for t in samples]})
  scores = {}
  for g in cfg.groups:
    scores[g] = mean(wins[g])
    scores[f"{g}/score"] = mean(means[g])
  scores["win_rate"] = mean([scores[g] for g in cfg.groups])
  return SuiteResult(scores, records)
