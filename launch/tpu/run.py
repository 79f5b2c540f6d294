r"""Runs a training job on a Cloud TPU slice: create, install, train, stream logs, tear down.

  python -m launch.tpu.run --name=spade-games-4b --zone=us-east5-a --accelerator=v5p-64 \
      --config=experiments/configs/games.py:model=qwen3_4b_instruct_2507,mesh=v5p-64 \
      --workdir=gs://BUCKET/runs/games_4b \
      --checkpoint=gs://BUCKET/checkpoints/Qwen3-4B-Instruct-2507 [--queued] [--dry_run]

Steps (each a `gcloud` command, printed before it runs; --dry_run only prints them):

1. create the TPU VM, or a queued resource with --queued, and wait until it is ready;
2. copy this checkout to every host (`tpu-vm scp --worker=all`);
3. on every host: install bubblewrap (the sandbox's strongest layer), the pinned
   requirements and JAX's TPU backend, and copy the starting checkpoint from GCS to local
   disk (the Hugging Face importer reads local files);
4. on every host: `python -m launch.train --multihost --config=... --workdir=gs://...`;
   every host's output streams back through ssh (process 0 writes metrics and checkpoints);
5. delete the slice (unless --keep). A rerun with the same --workdir resumes.

`--steps=create,install,train,delete` runs a subset, e.g. `--steps=train` on a kept slice.
"""

import os
import shlex
import subprocess
import sys
import time

from absl import app
from absl import flags

from spade_jax import console

_NAME = flags.DEFINE_string("name", None, "TPU VM (and queued resource) name.")
_ZONE = flags.DEFINE_string("zone", None, "GCP zone, e.g. us-east5-a.")
_PROJECT = flags.DEFINE_string("project", None, "GCP project (default: gcloud's).")
_ACCEL = flags.DEFINE_string("accelerator", "v5p-64", "Accelerator type.")
_VERSION = flags.DEFINE_string("version", "v2-alpha-tpuv5", "TPU software version.")
_QUEUED = flags.DEFINE_bool("queued", False, "Create through a queued resource.")
_SPOT = flags.DEFINE_bool("spot", False, "Queued resource on spot capacity.")
_CONFIG = flags.DEFINE_string("config", None, "launch.train --config value.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory, gs://... (shared by hosts).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "gs:// path of the starting HF checkpoint, copied to every host's "
    "~/checkpoints/<basename> (where the recipes look by default).")
_EXTRA = flags.DEFINE_list("train_args", [], "Extra launch.train flags, e.g. --config.seed=1.")
_STEPS = flags.DEFINE_list("steps", ["create", "install", "train", "delete"],
                           "Steps to run, in order.")
_KEEP = flags.DEFINE_bool("keep", False, "Do not delete the slice at the end.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the gcloud commands; run nothing.")

STEPS = ("create", "install", "train", "delete")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REMOTE_DIR = "~/spade_jax"
JAX_TPU = "jax[tpu]==0.10.2"


def _common() -> list[str]:
  out = [f"--zone={_ZONE.value}"]
  if _PROJECT.value:
    out.append(f"--project={_PROJECT.value}")
  return out


def _ssh(command: str) -> list[str]:
  return (["gcloud", "compute", "tpus", "tpu-vm", "ssh", _NAME.value, "--worker=all"]
          + _common() + [f"--command={command}"])


def commands(step: str) -> list[list[str]]:
  """The gcloud command lines of one step."""
  name, tpu = _NAME.value, ["gcloud", "compute", "tpus"]
  if step == "create":
    if _QUEUED.value:
      return [tpu + ["queued-resources", "create", name, f"--node-id={name}",
                     f"--accelerator-type={_ACCEL.value}", f"--runtime-version={_VERSION.value}"]
              + (["--spot"] if _SPOT.value else []) + _common()]
    return [tpu + ["tpu-vm", "create", name, f"--accelerator-type={_ACCEL.value}",
                   f"--version={_VERSION.value}"] + _common()]
  if step == "install":
    setup = (f"sudo apt-get update -qq && sudo apt-get install -y -qq bubblewrap && "
             f"cd {REMOTE_DIR} && python3 -m pip install -q -r requirements.txt "
             f"'{JAX_TPU}' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html")
    if _CHECKPOINT.value:
      base = _CHECKPOINT.value.rstrip("/").rsplit("/", 1)[-1]
      setup += (f" && mkdir -p ~/checkpoints && gcloud storage cp -r "
                f"{shlex.quote(_CHECKPOINT.value)} ~/checkpoints/{base}")
    return [["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", REPO,
             f"{name}:{REMOTE_DIR}", "--worker=all"] + _common(), _ssh(setup)]
  if step == "train":
    args = ["python3", "-m", "launch.train", "--multihost", f"--config={_CONFIG.value}",
            f"--workdir={_WORKDIR.value}", *_EXTRA.value]
    return [_ssh(f"cd {REMOTE_DIR} && {shlex.join(args)} 2>&1 | tee -a ~/train.log")]
  if step == "delete":
    if _QUEUED.value:
      return [tpu + ["queued-resources", "delete", name, "--force", "--quiet"] + _common()]
    return [tpu + ["tpu-vm", "delete", name, "--quiet"] + _common()]
  raise ValueError(f"Unknown step {step!r}; expected one of {STEPS}.")


def _wait_ready() -> None:
  """Polls a queued resource until its slice is active."""
  cmd = (["gcloud", "compute", "tpus", "queued-resources", "describe", _NAME.value,
          "--format=value(state.state)"] + _common())
  while True:
    state = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    print(f"[tpu] queued resource {_NAME.value}: {state}", flush=True)
    if state == "ACTIVE":
      return
    if state in ("FAILED", "SUSPENDED"):
      raise RuntimeError(f"Queued resource {_NAME.value} is {state}; see `gcloud compute tpus "
                         "queued-resources describe`.")
    time.sleep(30)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for flag in (_NAME, _ZONE):
    if not flag.value:
      raise app.UsageError(f"--{flag.name} is required.")
  steps = [s for s in _STEPS.value if not (s == "delete" and _KEEP.value)]
  bad = sorted(set(steps) - set(STEPS))
  if bad:
    raise app.UsageError(f"Unknown --steps {bad}; expected a subset of {list(STEPS)}.")
  if "train" in steps:
    if not _CONFIG.value or not _WORKDIR.value:
      raise app.UsageError("The train step needs --config and --workdir.")
    if not _WORKDIR.value.startswith("gs://"):
      raise app.UsageError(f"--workdir={_WORKDIR.value!r}: hosts of a slice share a gs:// "
                           "workdir; pass gs://BUCKET/...")
  failed = None
  for step in steps:
    if failed is not None and step != "delete":
      continue
    for cmd in commands(step):
      print("[tpu] $ " + shlex.join(cmd), flush=True)
      if _DRY_RUN.value:
        continue
      rc = subprocess.run(cmd, check=False).returncode
      if rc:
        failed = (step, rc)
        print(f"[tpu] step {step} failed with exit status {rc}", file=sys.stderr, flush=True)
        break
    if step == "create" and _QUEUED.value and not _DRY_RUN.value and failed is None:
      _wait_ready()
  if failed is not None:
    raise SystemExit(f"step {failed[0]} failed (exit status {failed[1]})")


if __name__ == "__main__":
  console.run(main)
