"""Corpus: offline embedded default, seeded order, resumable state, other sources."""

import json
import os
import socket
import tempfile

import pytest

from spade_jax.designer.corpus import Corpus, CorpusConfig, Document, permute_index, truncate


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A fresh workdir in which the embedded corpus is built with the network blocked."""
  path = str(tmp_path_factory.mktemp("run"))

  def no_network(*args, **kwargs):
    raise OSError("network access attempted while building the offline corpus")

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(socket.socket, "connect", no_network)
    mp.setattr(socket, "create_connection", no_network)
    mp.setattr(socket, "getaddrinfo", no_network)
    Corpus(CorpusConfig(), workdir=path, seed=0)
  return path


def take(corpus, n):
  return [corpus.next() for _ in range(n)]


def test_embedded_default_builds_offline_under_workdir(workdir):
  built = os.path.join(workdir, "tfds", "spade_stdlib_docs")
  assert os.path.isdir(built)
  corpus = Corpus(CorpusConfig(), workdir=workdir, seed=0)
  assert len(corpus) > 100
  ids = [corpus.get(i).id for i in range(len(corpus))]
  assert len(set(ids)) == len(ids)
  prefixes = {i.split("/")[0] for i in ids}
  assert {"pydoc_topics", "stdlib", "license"} <= prefixes


def test_building_leaves_no_folder_in_the_temp_dir(tmp_path, monkeypatch):
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  (scratch / "tmpkeptfds").mkdir()  # another process's, there before: left alone
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  Corpus(CorpusConfig(), workdir=str(tmp_path / "run"), seed=0)
  assert os.path.isdir(tmp_path / "run" / "tfds" / "spade_stdlib_docs")
  assert os.listdir(scratch) == ["tmpkeptfds"]
  from spade_jax.designer import stdlib_docs  # pylint: disable=g-import-not-at-top
  Corpus(CorpusConfig(source="tfds", name=f"spade_stdlib_docs/{stdlib_docs.config_name()}",
                      data_dir=str(tmp_path / "run" / "tfds"), id_key="id"), seed=0)
  assert os.listdir(scratch) == ["tmpkeptfds"]


def test_same_seed_same_sequence_and_seeds_differ(workdir):
  a = take(Corpus(CorpusConfig(), workdir=workdir, seed=3), 15)
  b = take(Corpus(CorpusConfig(), workdir=workdir, seed=3), 15)
  c = take(Corpus(CorpusConfig(), workdir=workdir, seed=4), 15)
  assert a == b
  assert [d.id for d in a] != [d.id for d in c]
  assert all(isinstance(d, Document) and len(d.text.split()) <= 600 for d in a)


def test_state_restore_continues_exactly(workdir):
  reference = Corpus(CorpusConfig(), workdir=workdir, seed=7)
  take(reference, 9)
  state = json.loads(json.dumps(reference.state()))  # Survives a JSON round trip.
  expected = take(reference, 12)
  resumed = Corpus(CorpusConfig(), workdir=workdir, seed=0)  # Seed comes from the state.
  resumed.restore(state)
  assert take(resumed, 12) == expected


def test_epoch_is_a_permutation_and_wraps(workdir):
  corpus = Corpus(CorpusConfig(max_words=5), workdir=workdir, seed=1)
  n = len(corpus)
  first = [d.id for d in take(corpus, n)]
  assert len(set(first)) == n
  assert corpus.state()["epoch"] == 1 and corpus.state()["position"] == 0
  second = [d.id for d in take(corpus, n)]
  assert sorted(second) == sorted(first) and second != first


def test_tfds_source_by_name_reads_the_built_dataset(workdir):
  from spade_jax.designer import stdlib_docs  # pylint: disable=g-import-not-at-top
  cfg = CorpusConfig(source="tfds", name=f"spade_stdlib_docs/{stdlib_docs.config_name()}",
                     data_dir=os.path.join(workdir, "tfds"), id_key="id")
  corpus = Corpus(cfg, seed=0)
  embedded = Corpus(CorpusConfig(), workdir=workdir, seed=0)
  assert len(corpus) == len(embedded)
  assert corpus.get(5) == embedded.get(5)
  missing = CorpusConfig(source="tfds", name="mnist", data_dir=os.path.join(workdir, "none"))
  with pytest.raises(FileNotFoundError, match="tfds build mnist"):
    Corpus(missing)


def test_restore_refuses_another_source(workdir, tmp_path):
  path = tmp_path / "docs.jsonl"
  path.write_text("\n".join(json.dumps({"text": f"doc {i} " + "w " * 40}) for i in range(5)))
  other = Corpus(CorpusConfig(source="jsonl", paths=(str(path),)), seed=0)
  with pytest.raises(ValueError, match="same CorpusConfig"):
    Corpus(CorpusConfig(), workdir=workdir).restore(other.state())


def test_permute_index_is_a_bijection():
  for n in (1, 2, 3, 7, 100, 1000):
    key = b"k" * 16
    got = [permute_index(i, n, key) for i in range(n)]
    assert sorted(got) == list(range(n))
  assert [permute_index(i, 50, b"a" * 16) for i in range(50)] != list(range(50))


def test_truncate_by_words_and_tokens():
  text = "alpha beta\ngamma  delta epsilon"
  assert truncate(text, max_words=3) == "alpha beta\ngamma"
  assert truncate(text) == text
  chars = list  # One token per character.
  assert truncate(text, max_tokens=12, tokenizer=chars) == "alpha beta"
  assert truncate(text, max_words=1, max_tokens=100, tokenizer=chars) == "alpha"
  assert truncate(text, max_tokens=3, tokenizer=chars) == ""
  with pytest.raises(ValueError, match="tokenizer"):
    truncate(text, max_tokens=3)


def test_jsonl_and_text_sources(tmp_path):
  lines = [{"body": f"document number {i} " + "filler " * 40, "key": f"k{i}"}
           for i in range(6)]
  lines.append({"body": "too short", "key": "short"})
  path = tmp_path / "a.jsonl"
  path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  cfg = CorpusConfig(source="jsonl", paths=[str(tmp_path / "*.jsonl")], text_key="body",
                     id_key="key", max_tokens=8)
  corpus = Corpus(cfg, seed=0, tokenizer=str.split)
  assert len(corpus) == 6  # The short one is filtered by min_words.
  doc = corpus.next()
  assert doc.id.startswith("k") and len(doc.text.split()) == 8
  with pytest.raises(KeyError, match="text_key"):
    Corpus(CorpusConfig(source="jsonl", paths=(str(path),), text_key="missing"))
  with pytest.raises(ValueError, match="tokenizer"):
    Corpus(CorpusConfig(source="jsonl", paths=(str(path),), max_tokens=5))
  for i in range(3):
    (tmp_path / f"t{i}.txt").write_text(f"text file {i} " + "word " * 50)
  texts = Corpus(CorpusConfig(source="text", paths=(str(tmp_path / "*.txt"),), max_words=4))
  assert sorted(texts.get(i).id for i in range(3)) == ["t0.txt", "t1.txt", "t2.txt"]
  assert len(texts.next().text.split()) == 4


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match="expected one of"):
    CorpusConfig(source="web")
  with pytest.raises(ValueError, match="needs `paths`"):
    CorpusConfig(source="jsonl")
  with pytest.raises(ValueError, match="needs `name`"):
    CorpusConfig(source="tfds")
  with pytest.raises(FileNotFoundError, match="matches no file"):
    Corpus(CorpusConfig(source="text", paths=("/nonexistent/*.txt",)))


def test_seqio_task_source():
  seqio = pytest.importorskip("seqio")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def docs(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices(
        {"text": [f"seqio document {i} " + "word " * 40 for i in range(7)]})

  name = "spade_jax_test_corpus_docs"
  if name not in seqio.TaskRegistry.names():
    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(docs, splits=["train"]),
        output_features={"text": seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False,
                                               dtype=tf.string, rank=0)})
  corpus = Corpus(CorpusConfig(source="seqio", name=name, max_words=3), seed=0)
  assert len(corpus) == 7
  got = take(corpus, 7)
  assert sorted(d.id for d in got) == [f"{name}:{i}" for i in range(7)]
  assert got[0].text.startswith("seqio document") and len(got[0].text.split()) == 3
  with pytest.raises(ValueError, match="not registered"):
    Corpus(CorpusConfig(source="seqio", name="spade_jax_no_such_task"))
