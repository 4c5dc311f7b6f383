"""A message template is classified once however often it repeats (decision 0516), and
the results are exactly those of classifying every line afresh: on the corpus, on lines
that differ only in their timestamps or numbers, and on a generated log."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainguard.diagnose import signatures, templates
from trainguard.diagnose.signatures import Classifier, classify_line, normalize_message
from trainguard.diagnose.templates import TemplateCache, template_key

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def _corpus_lines() -> list[str]:
    lines = [e["text"] for e in yaml.safe_load((CORPUS / "signatures.yaml").read_text())]
    held = yaml.safe_load((CORPUS / "heldout.yaml").read_text())
    for group in held.values() if isinstance(held, dict) else []:
        if isinstance(group, list):
            lines += [e["text"] for e in group if isinstance(e, dict) and "text" in e]
    lines += [
        ln
        for ln in (CORPUS / "noise.txt").read_text().splitlines()
        if ln and not ln.startswith("# ")
    ]
    return lines


def _fields(m):
    return None if m is None else (m.__dict__ | {"details": m.details})


@pytest.fixture
def no_templates(monkeypatch):
    """Classification with the caches holding nothing: every line built afresh."""

    def cold() -> None:
        monkeypatch.setattr(signatures, "_TEMPLATES", TemplateCache(limit=0))
        monkeypatch.setattr(templates, "_NORMALIZED", TemplateCache(limit=0))

    return cold


STAMPS = (
    "[{a}.{b:06d}] ",
    "[Sat Nov 29 12:{a2:02d}:{b2:02d} 2025] ",
    "2025-11-29T12:{a2:02d}:{b2:02d}.{b:06d}+00:00 ",
    "Nov 29 12:{a2:02d}:{b2:02d} node7 kernel: ",
)


def _stamped(line: str, rng: random.Random) -> list[str]:
    out = []
    for stamp in STAMPS:
        a, b = rng.randrange(1, 99999), rng.randrange(10**6)
        out.append(stamp.format(a=a, b=b, a2=a % 60, b2=b % 60) + line)
    return out


def test_repeats_classify_exactly_as_fresh_lines(no_templates):
    rng = random.Random(7)
    lines = []
    for line in _corpus_lines():
        lines.append(line)
        lines += _stamped(line, rng) * 2
        lines.append(
            f"[W1129 12:00:{rng.randrange(60):02d}.{rng.randrange(10**6):06d} x.cpp:1] {line}"
        )
    warm = [_fields(classify_line(ln)) for ln in lines]
    warm_again = [_fields(classify_line(ln)) for ln in lines]
    no_templates()
    cold = [_fields(classify_line(ln)) for ln in lines]
    assert warm == cold == warm_again
    assert sum(m is not None for m in cold) > 300


def test_a_stream_classifies_alike_with_and_without_templates(no_templates):
    rng = random.Random(3)
    corpus = _corpus_lines()
    text = "\n".join(rng.choice(_stamped(rng.choice(corpus), rng)) for _ in range(4000)) + "\n"
    warm = [_fields(m) for m in Classifier().feed_all([text])]
    no_templates()
    cold = [_fields(m) for m in Classifier().feed_all([text])]
    assert warm == cold and len(warm) > 1000


def test_the_template_key_cuts_only_timestamps():
    a = "[  12.000001] pcieport 0000:00:03.1: AER: Corrected error received: 0000:c1:00.0"
    b = "[  99.123456] pcieport 0000:00:03.1: AER: Corrected error received: 0000:c1:00.0"
    c = "[9999.123456] pcieport 0000:00:03.1: AER: Corrected error received: 0000:c2:00.0"
    key = template_key
    assert key(a, "12.000001") == key(b, "99.123456") != key(c, "9999.123456")
    g1 = "[W1129 12:00:01.123456 socket.cpp:558] [c10d] The client socket has failed"
    g2 = "[W1130 07:59:59.000001 socket.cpp:558] [c10d] The client socket has failed"
    assert key(g1, None) == key(g2, None)


text_st = st.lists(
    st.sampled_from([*"0123456789abcdefABCDEF:.-x \t", "GPU-", "PCI:", "0x", "0000:c1:00."]),
    max_size=40,
).map("".join)


@settings(max_examples=400)
@given(text_st, st.randoms(use_true_random=False))
@example("card 0000:c1:00.8 up", random.Random(1))
@example("addr 0x1f0 and 5x3", random.Random(2))
def test_bodies_that_fold_alike_normalise_alike(body: str, rnd: random.Random):
    """The normalisation cache's key (the digits folded) never joins two bodies that
    normalise differently: a body and its copy with other digits, whenever they fold to
    one key; and the cached normalisation is the normalisation."""
    other = "".join(rnd.choice("0123456789") if c.isdigit() else c for c in body)
    if templates._fold(body) == templates._fold(other):
        assert templates._normalize(body) == templates._normalize(other)
    assert normalize_message(body) == templates._normalize(body)
    assert normalize_message(other) == templates._normalize(other)


def test_the_nic_port_is_found_as_by_the_word_boundary_regexes():
    """_port_of skips regexes by literal and checks the word start in Python: the same
    port as the plain word-boundary regexes it replaces, on random token soups."""
    import re

    plain = (
        re.compile(r"\b(?P<port>mlx\d_\d+:? port \d+|mlx\d_\d+:\d+)"),
        re.compile(r"\b[Mm]odule (?P<port>\d+)\b"),
        re.compile(r"\b(?P<port>Port:? \d+)"),
        re.compile(r"\b(?P<port>(?:ib|ibp|en[ops]|eth|bond)\w*)(?=:? )"),
    )

    def reference(text: str) -> str | None:
        for i, rx in enumerate(plain):
            m = rx.search(text)
            if m:
                return f"module {m.group('port')}" if i == 1 else m.group("port")
        return None

    rng = random.Random(5)
    toks = "ib ib0 ibp enp1s0 eno eth bond0 x _ : Port port Module mlx5_0 é 0 1 - beth lib"
    toks = [*toks.split(), " ", "Port: 1", "port 2", "mlx5_0:1", "Module 3"]
    for _ in range(20000):
        text = "".join(rng.choice(toks) for _ in range(rng.randrange(1, 12)))
        assert signatures._port_of(text) == reference(text), text
