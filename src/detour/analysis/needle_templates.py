"""Fact templates and lexicons for the needle-in-a-haystack probe (`detour needle`), English and French.

    python -c "from detour.analysis.needle_templates import make_facts; print(make_facts(4, 'en', 0))"

Eight templates a language, as in the paper: drug with dose and route, vital signs, lab result,
diagnosis, procedure, allergy, treatment duration, symptom; each has 2-4 slots filled from small
lexicons. A positive query repeats the needle's fact; a negative query uses the same template with
other values in EVERY slot, so positives and negatives differ only in slot values. The lexicons are
the probe's own (independent of the synthetic corpus's), so a haystack rarely states the query fact.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_SLOT = re.compile(r"\{(\w+)\}")

# Shared lexicons; numbers are strings because they are text in the sentence.
EN = {
    "drug": ["amoxicillin", "metformin", "furosemide", "warfarin", "ceftriaxone", "prednisone", "heparin", "lisinopril"],
    "dose": ["5", "10", "20", "40", "80", "125", "250", "500"],
    "route": ["orally", "intravenously", "subcutaneously", "intramuscularly"],
    "systolic": ["95", "110", "128", "142", "160", "175"],
    "diastolic": ["55", "62", "70", "84", "92", "101"],
    "heart_rate": ["48", "62", "76", "88", "104", "121"],
    "lab": ["creatinine", "hemoglobin", "potassium", "sodium", "troponin", "lactate"],
    "value": ["0.8", "1.4", "2.9", "3.6", "7.2", "11.5", "135", "148"],
    "day": ["one", "two", "three", "four", "five", "six"],
    "diagnosis": ["pneumonia", "pulmonary embolism", "acute pancreatitis", "sarcoidosis", "endocarditis", "Crohn disease"],
    "team": ["cardiology", "neurology", "infectious disease", "rheumatology", "gastroenterology"],
    "procedure": ["a colonoscopy", "a lumbar puncture", "a thoracentesis", "an appendectomy", "a bronchoscopy", "a skin biopsy"],
    "allergen": ["penicillin", "sulfonamides", "latex", "iodinated contrast", "peanuts", "aspirin"],
    "reaction": ["hives", "angioedema", "a rash", "wheezing", "anaphylaxis"],
    "duration": ["three", "five", "seven", "ten", "fourteen", "twenty-one"],
    "unit": ["days", "weeks", "months"],
    "symptom": ["sharp pain", "numbness", "swelling", "burning", "stiffness", "itching"],
    "site": ["left knee", "right shoulder", "lower back", "chest", "left foot", "neck"],
}

FR = {
    "drug": ["amoxicilline", "metformine", "furosémide", "warfarine", "ceftriaxone", "prednisone", "héparine", "lisinopril"],
    "dose": ["5", "10", "20", "40", "80", "125", "250", "500"],
    "route": ["par voie orale", "par voie intraveineuse", "par voie sous-cutanée", "par voie intramusculaire"],
    "systolic": ["95", "110", "128", "142", "160", "175"],
    "diastolic": ["55", "62", "70", "84", "92", "101"],
    "heart_rate": ["48", "62", "76", "88", "104", "121"],
    "lab": ["créatininémie", "glycémie", "kaliémie", "natrémie", "troponine", "lactatémie"],
    "value": ["0,8", "1,4", "2,9", "3,6", "7,2", "11,5", "135", "148"],
    "day": ["un", "deux", "trois", "quatre", "cinq", "six"],
    "diagnosis": ["pneumopathie", "embolie pulmonaire", "pancréatite aiguë", "sarcoïdose", "endocardite", "maladie de Crohn"],
    "team": ["cardiologie", "neurologie", "infectiologie", "rhumatologie", "gastro-entérologie"],
    "procedure": ["une coloscopie", "une ponction lombaire", "une ponction pleurale", "une appendicectomie", "une fibroscopie bronchique", "une biopsie cutanée"],
    "allergen": ["la pénicilline", "la codéine", "la morphine", "l'iode", "l'arachide", "l'aspirine"],
    "reaction": ["une urticaire", "un angio-œdème", "une éruption cutanée", "un sifflement", "une anaphylaxie"],
    "duration": ["trois", "cinq", "sept", "dix", "quatorze", "vingt et un"],
    "unit": ["jours", "semaines", "mois"],
    "symptom": ["une douleur vive", "un engourdissement", "un gonflement", "une brûlure", "une raideur", "un prurit"],
    "site": ["genou gauche", "coude droit", "bas du dos", "thorax", "pied gauche", "cou"],
}

TEMPLATES = {
    "en": {
        "drug": "The patient was given {drug} {dose} mg {route} twice a day.",
        "vitals": "Blood pressure was {systolic}/{diastolic} mmHg with a heart rate of {heart_rate} beats per minute.",
        "lab": "On hospital day {day}, the {lab} measured {value}.",
        "diagnosis": "The {team} team made a diagnosis of {diagnosis}.",
        "procedure": "On day {day} of the stay, the patient underwent {procedure}.",
        "allergy": "The patient has a known allergy to {allergen}, which causes {reaction}.",
        "duration": "Treatment with {drug} was continued for {duration} {unit}.",
        "symptom": "The patient complained of {symptom} in the {site} since day {day}.",
    },
    "fr": {
        "drug": "Le patient a reçu {drug} {dose} mg {route} deux fois par jour.",
        "vitals": "La pression artérielle était de {systolic}/{diastolic} mmHg avec une fréquence cardiaque de {heart_rate} battements par minute.",
        "lab": "Au jour {day} de l'hospitalisation, la {lab} était à {value}.",
        "diagnosis": "L'équipe de {team} a posé le diagnostic de {diagnosis}.",
        "procedure": "Au jour {day} du séjour, le patient a bénéficié d'{procedure}.",
        "allergy": "Le patient présente une allergie connue à {allergen}, responsable d'{reaction}.",
        "duration": "Le traitement par {drug} a été poursuivi pendant {duration} {unit}.",
        "symptom": "Le patient se plaignait d'{symptom} au niveau du {site} depuis le jour {day}.",
    },
}
LEXICONS = {"en": EN, "fr": FR}


@dataclass(frozen=True)
class Fact:
    template: str  # template name, e.g. "drug"
    needle: str  # the fact inserted in the haystack
    query: str  # the fact asked about: the needle (positive) or other slot values (negative)
    label: int  # 1 when the query is the needle's fact
    needle_values: dict
    query_values: dict


def slots(template: str) -> list[str]:
    return _SLOT.findall(template)


def render(template: str, values: dict) -> str:
    return template.format(**values)


def make_fact(name: str, lang: str, label: int, rng: random.Random) -> Fact:
    """One needle and its query; a negative changes every slot to another value of its lexicon."""
    template, lexicon = TEMPLATES[lang][name], LEXICONS[lang]
    needle_values = {s: rng.choice(lexicon[s]) for s in slots(template)}
    if label:
        query_values = dict(needle_values)
    else:
        query_values = {s: rng.choice([v for v in lexicon[s] if v != needle_values[s]]) for s in slots(template)}
    return Fact(name, render(template, needle_values), render(template, query_values), label, needle_values, query_values)


def make_facts(n: int, lang: str, seed: int) -> list[Fact]:
    """n facts cycling over the templates, labels alternating (balanced), seeded."""
    if lang not in TEMPLATES:
        raise ValueError(f"no needle templates for language {lang!r} (have: {', '.join(TEMPLATES)})")
    rng = random.Random(seed)
    names = list(TEMPLATES[lang])
    return [make_fact(names[i % len(names)], lang, 1 - (i // len(names)) % 2, rng) for i in range(n)]
