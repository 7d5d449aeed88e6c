import re

import pytest

from detour.data import synthetic
from detour.errors import DetourError


def test_same_seed_same_documents_and_seeds_differ():
    a = list(synthetic.generate_documents(20, seed=0))
    assert a == list(synthetic.generate_documents(20, seed=0))
    b = list(synthetic.generate_documents(20, seed=1))
    assert sum(x != y for x, y in zip(a, b)) == 20
    # document i does not depend on how many documents were asked for
    assert list(synthetic.generate_documents(5, seed=0)) == a[:5]


def test_documents_are_multi_paragraph_case_reports_of_the_right_size():
    docs = list(synthetic.generate_documents(300, seed=0))
    words = [len(d.split()) for d in docs]
    assert 100 <= min(words) and max(words) <= 600
    assert 200 <= sum(words) / len(words) <= 400
    assert all(d.count("\n\n") >= 4 for d in docs)
    text = "\n".join(docs)
    # values with units, drugs with doses and routes, diagnoses: all drawn from the exposed lexicons
    assert sum(name in text for name in synthetic.DIAGNOSES) == len(synthetic.DIAGNOSES)
    assert sum(drug in text for drug in synthetic.DRUGS) >= 0.9 * len(synthetic.DRUGS)
    assert "mmol/L" in text and "beats per minute" in text and "orally" in text and "intravenously" in text


@pytest.mark.parametrize("lang", ["en", "fr"])
def test_text_is_varied_enough_to_keep_a_small_model_learning(lang):
    # (measured: a 4-layer ModernBERT's held-out MLM loss still fell steeply at 350k tokens)
    docs = list(synthetic.generate_documents(500, seed=0, lang=lang))
    sentences = [s.strip() for d in docs for s in re.split(r"(?<=\.)\s+", d) if s.strip()]
    assert len(set(sentences)) > 0.4 * len(sentences)  # mostly not boilerplate
    assert len({w for d in docs for w in d.split()}) > 1000


def test_french_documents():
    docs = list(synthetic.generate_documents(50, seed=0, lang="fr"))
    text = "\n".join(docs)
    assert "ans" in text and "Le diagnostic retenu était" in text and "par voie" in text
    assert docs != list(synthetic.generate_documents(50, seed=0, lang="en"))


def test_unknown_language_is_a_user_error():
    with pytest.raises(DetourError, match="lang"):
        list(synthetic.generate_documents(1, lang="de"))
