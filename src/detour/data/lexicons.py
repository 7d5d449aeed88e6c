"""Lexicons of the SYNTHETIC clinical case generator (and of the needle probe's fact templates).

    python -c "from detour.data.lexicons import DRUGS; print(len(DRUGS), sorted(DRUGS)[:5])"

Every entry is invented-but-plausible clinical vocabulary, keyed by its English name; `fr` holds
the French name. The values are coherent on purpose (a diagnosis has its own symptoms, abnormal
labs and usual drugs) so that a small model has structure to learn for a few hundred thousand
tokens. Nothing here is medical advice or real patient data.
"""

from __future__ import annotations

# route -> (adverb, French adjective phrase)
ROUTES: dict[str, dict] = {
    "oral": {"adverb": "orally", "fr": "par voie orale"},
    "intravenous": {"adverb": "intravenously", "fr": "par voie intraveineuse"},
    "intramuscular": {"adverb": "intramuscularly", "fr": "par voie intramusculaire"},
    "subcutaneous": {"adverb": "subcutaneously", "fr": "par voie sous-cutanée"},
    "inhaled": {"adverb": "by inhalation", "fr": "par voie inhalée"},
    "topical": {"adverb": "topically", "fr": "par voie locale"},
    "sublingual": {"adverb": "sublingually", "fr": "par voie sublinguale"},
    "transdermal": {"adverb": "transdermally", "fr": "par voie transdermique"},
}

FREQUENCIES: dict[str, str] = {
    "once daily": "une fois par jour",
    "twice daily": "deux fois par jour",
    "three times daily": "trois fois par jour",
    "every 8 hours": "toutes les 8 heures",
    "every 6 hours": "toutes les 6 heures",
    "once weekly": "une fois par semaine",
    "as needed": "à la demande",
    "at bedtime": "au coucher",
}

# drug -> class, usual doses, unit, routes, French name
DRUGS: dict[str, dict] = {
    "amoxicillin": {"class": "antibiotic", "doses": (500, 875, 1000), "unit": "mg", "routes": ("oral",), "fr": "amoxicilline"},
    "ceftriaxone": {"class": "antibiotic", "doses": (1, 2), "unit": "g", "routes": ("intravenous", "intramuscular"), "fr": "ceftriaxone"},
    "piperacillin-tazobactam": {"class": "antibiotic", "doses": (4.5,), "unit": "g", "routes": ("intravenous",), "fr": "pipéracilline-tazobactam"},
    "vancomycin": {"class": "antibiotic", "doses": (1, 1.5), "unit": "g", "routes": ("intravenous",), "fr": "vancomycine"},
    "azithromycin": {"class": "antibiotic", "doses": (250, 500), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "azithromycine"},
    "ciprofloxacin": {"class": "antibiotic", "doses": (250, 500, 750), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "ciprofloxacine"},
    "doxycycline": {"class": "antibiotic", "doses": (100,), "unit": "mg", "routes": ("oral",), "fr": "doxycycline"},
    "metronidazole": {"class": "antibiotic", "doses": (400, 500), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "métronidazole"},
    "nitrofurantoin": {"class": "antibiotic", "doses": (50, 100), "unit": "mg", "routes": ("oral",), "fr": "nitrofurantoïne"},
    "aciclovir": {"class": "antiviral", "doses": (400, 800), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "aciclovir"},
    "oseltamivir": {"class": "antiviral", "doses": (75,), "unit": "mg", "routes": ("oral",), "fr": "oséltamivir"},
    "fluconazole": {"class": "antifungal", "doses": (150, 200, 400), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "fluconazole"},
    "paracetamol": {"class": "analgesic", "doses": (500, 1000), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "paracétamol"},
    "ibuprofen": {"class": "anti-inflammatory", "doses": (200, 400, 600), "unit": "mg", "routes": ("oral",), "fr": "ibuprofène"},
    "morphine": {"class": "opioid analgesic", "doses": (2, 5, 10), "unit": "mg", "routes": ("intravenous", "subcutaneous", "oral"), "fr": "morphine"},
    "tramadol": {"class": "opioid analgesic", "doses": (50, 100), "unit": "mg", "routes": ("oral",), "fr": "tramadol"},
    "prednisolone": {"class": "corticosteroid", "doses": (5, 20, 40, 60), "unit": "mg", "routes": ("oral",), "fr": "prednisolone"},
    "methylprednisolone": {"class": "corticosteroid", "doses": (125, 500, 1000), "unit": "mg", "routes": ("intravenous",), "fr": "méthylprednisolone"},
    "hydrocortisone": {"class": "corticosteroid", "doses": (50, 100), "unit": "mg", "routes": ("intravenous",), "fr": "hydrocortisone"},
    "salbutamol": {"class": "bronchodilator", "doses": (100, 200), "unit": "µg", "routes": ("inhaled",), "fr": "salbutamol"},
    "furosemide": {"class": "loop diuretic", "doses": (20, 40, 80), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "furosémide"},
    "spironolactone": {"class": "diuretic", "doses": (25, 50), "unit": "mg", "routes": ("oral",), "fr": "spironolactone"},
    "bisoprolol": {"class": "beta blocker", "doses": (1.25, 2.5, 5, 10), "unit": "mg", "routes": ("oral",), "fr": "bisoprolol"},
    "metoprolol": {"class": "beta blocker", "doses": (25, 50, 100), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "métoprolol"},
    "ramipril": {"class": "ACE inhibitor", "doses": (2.5, 5, 10), "unit": "mg", "routes": ("oral",), "fr": "ramipril"},
    "amlodipine": {"class": "calcium channel blocker", "doses": (5, 10), "unit": "mg", "routes": ("oral",), "fr": "amlodipine"},
    "atorvastatin": {"class": "statin", "doses": (10, 20, 40, 80), "unit": "mg", "routes": ("oral",), "fr": "atorvastatine"},
    "aspirin": {"class": "antiplatelet", "doses": (75, 100, 300), "unit": "mg", "routes": ("oral",), "fr": "aspirine"},
    "clopidogrel": {"class": "antiplatelet", "doses": (75, 300, 600), "unit": "mg", "routes": ("oral",), "fr": "clopidogrel"},
    "enoxaparin": {"class": "anticoagulant", "doses": (40, 60, 80), "unit": "mg", "routes": ("subcutaneous",), "fr": "énoxaparine"},
    "heparin": {"class": "anticoagulant", "doses": (5000, 7500), "unit": "units", "routes": ("intravenous", "subcutaneous"), "fr": "héparine"},
    "apixaban": {"class": "anticoagulant", "doses": (2.5, 5, 10), "unit": "mg", "routes": ("oral",), "fr": "apixaban"},
    "warfarin": {"class": "anticoagulant", "doses": (1, 3, 5), "unit": "mg", "routes": ("oral",), "fr": "warfarine"},
    "insulin glargine": {"class": "insulin", "doses": (10, 14, 20, 24), "unit": "units", "routes": ("subcutaneous",), "fr": "insuline glargine"},
    "metformin": {"class": "biguanide", "doses": (500, 850, 1000), "unit": "mg", "routes": ("oral",), "fr": "metformine"},
    "levothyroxine": {"class": "thyroid hormone", "doses": (25, 50, 75, 100), "unit": "µg", "routes": ("oral",), "fr": "lévothyroxine"},
    "omeprazole": {"class": "proton pump inhibitor", "doses": (20, 40), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "oméprazole"},
    "ondansetron": {"class": "antiemetic", "doses": (4, 8), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "ondansétron"},
    "levetiracetam": {"class": "antiepileptic", "doses": (500, 1000), "unit": "mg", "routes": ("oral", "intravenous"), "fr": "lévétiracétam"},
    "lorazepam": {"class": "benzodiazepine", "doses": (1, 2, 4), "unit": "mg", "routes": ("intravenous", "sublingual"), "fr": "lorazépam"},
    "haloperidol": {"class": "antipsychotic", "doses": (0.5, 1, 2.5), "unit": "mg", "routes": ("oral", "intramuscular"), "fr": "halopéridol"},
    "sertraline": {"class": "antidepressant", "doses": (50, 100), "unit": "mg", "routes": ("oral",), "fr": "sertraline"},
    "methotrexate": {"class": "immunosuppressant", "doses": (10, 15, 20), "unit": "mg", "routes": ("oral", "subcutaneous"), "fr": "méthotrexate"},
    "allopurinol": {"class": "xanthine oxidase inhibitor", "doses": (100, 300), "unit": "mg", "routes": ("oral",), "fr": "allopurinol"},
    "colchicine": {"class": "anti-inflammatory", "doses": (0.5, 1), "unit": "mg", "routes": ("oral",), "fr": "colchicine"},
    "nitroglycerin": {"class": "nitrate", "doses": (0.4, 5), "unit": "mg", "routes": ("sublingual", "transdermal"), "fr": "trinitrine"},
    "fentanyl": {"class": "opioid analgesic", "doses": (12, 25, 50), "unit": "µg/h", "routes": ("transdermal",), "fr": "fentanyl"},
    "hydrocortisone cream": {"class": "topical corticosteroid", "doses": (1,), "unit": "%", "routes": ("topical",), "fr": "crème d'hydrocortisone"},
}

# lab test -> unit, normal range, decimals, French name
LAB_TESTS: dict[str, dict] = {
    "hemoglobin": {"unit": "g/dL", "normal": (12.0, 16.0), "decimals": 1, "fr": "hémoglobine"},
    "white blood cell count": {"unit": "x10^9/L", "normal": (4.0, 10.0), "decimals": 1, "fr": "leucocytes"},
    "platelet count": {"unit": "x10^9/L", "normal": (150, 400), "decimals": 0, "fr": "plaquettes"},
    "C-reactive protein": {"unit": "mg/L", "normal": (0.5, 5.0), "decimals": 1, "fr": "protéine C réactive"},
    "procalcitonin": {"unit": "ng/mL", "normal": (0.02, 0.1), "decimals": 2, "fr": "procalcitonine"},
    "sodium": {"unit": "mmol/L", "normal": (135, 145), "decimals": 0, "fr": "natrémie"},
    "potassium": {"unit": "mmol/L", "normal": (3.5, 5.0), "decimals": 1, "fr": "kaliémie"},
    "creatinine": {"unit": "µmol/L", "normal": (60, 110), "decimals": 0, "fr": "créatinine"},
    "urea": {"unit": "mmol/L", "normal": (2.5, 7.5), "decimals": 1, "fr": "urée"},
    "glucose": {"unit": "mmol/L", "normal": (3.9, 6.1), "decimals": 1, "fr": "glycémie"},
    "HbA1c": {"unit": "%", "normal": (4.5, 5.9), "decimals": 1, "fr": "HbA1c"},
    "troponin I": {"unit": "ng/L", "normal": (2, 30), "decimals": 0, "fr": "troponine I"},
    "BNP": {"unit": "pg/mL", "normal": (10, 100), "decimals": 0, "fr": "BNP"},
    "D-dimer": {"unit": "µg/mL", "normal": (0.1, 0.5), "decimals": 2, "fr": "D-dimères"},
    "ALT": {"unit": "U/L", "normal": (7, 45), "decimals": 0, "fr": "ALAT"},
    "AST": {"unit": "U/L", "normal": (8, 40), "decimals": 0, "fr": "ASAT"},
    "total bilirubin": {"unit": "µmol/L", "normal": (3, 21), "decimals": 0, "fr": "bilirubine totale"},
    "lipase": {"unit": "U/L", "normal": (10, 60), "decimals": 0, "fr": "lipase"},
    "lactate": {"unit": "mmol/L", "normal": (0.5, 2.0), "decimals": 1, "fr": "lactates"},
    "TSH": {"unit": "mU/L", "normal": (0.4, 4.0), "decimals": 2, "fr": "TSH"},
    "uric acid": {"unit": "µmol/L", "normal": (200, 420), "decimals": 0, "fr": "acide urique"},
    "INR": {"unit": "", "normal": (0.9, 1.2), "decimals": 1, "fr": "INR"},
}

# vital sign -> unit, normal range, abnormal ranges (low, high), French name
VITAL_SIGNS: dict[str, dict] = {
    "heart rate": {"unit": "beats per minute", "normal": (60, 95), "low": (38, 55), "high": (105, 150), "fr": "fréquence cardiaque", "fr_unit": "battements par minute"},
    "systolic blood pressure": {"unit": "mmHg", "normal": (105, 135), "low": (70, 95), "high": (150, 210), "fr": "pression artérielle systolique", "fr_unit": "mmHg"},
    "respiratory rate": {"unit": "breaths per minute", "normal": (12, 18), "low": (8, 10), "high": (22, 36), "fr": "fréquence respiratoire", "fr_unit": "cycles par minute"},
    "temperature": {"unit": "°C", "normal": (36.4, 37.4), "low": (34.5, 35.8), "high": (38.1, 40.3), "fr": "température", "fr_unit": "°C"},
    "oxygen saturation": {"unit": "% on room air", "normal": (95, 99), "low": (82, 92), "high": (99, 100), "fr": "saturation en oxygène", "fr_unit": "% en air ambiant"},
}

SYMPTOMS: dict[str, str] = {
    "fever": "fièvre", "productive cough": "toux productive", "dry cough": "toux sèche",
    "shortness of breath": "dyspnée", "pleuritic chest pain": "douleur thoracique pleurale",
    "crushing chest pain": "douleur thoracique constrictive", "palpitations": "palpitations",
    "diaphoresis": "sueurs", "nausea": "nausées", "vomiting": "vomissements",
    "abdominal pain": "douleurs abdominales", "epigastric pain radiating to the back": "douleur épigastrique transfixiante",
    "right upper quadrant pain": "douleur de l'hypochondre droit", "diarrhea": "diarrhée",
    "jaundice": "ictère", "dysuria": "brûlures mictionnelles", "urinary frequency": "pollakiurie",
    "flank pain": "douleur lombaire", "headache": "céphalées", "neck stiffness": "raideur de nuque",
    "photophobia": "photophobie", "confusion": "confusion", "unilateral weakness": "déficit moteur unilatéral",
    "slurred speech": "dysarthrie", "seizure": "crise convulsive", "fatigue": "asthénie",
    "weight loss": "perte de poids", "polyuria": "polyurie", "polydipsia": "polydipsie",
    "leg swelling": "œdème des membres inférieurs", "orthopnea": "orthopnée", "wheezing": "sibilants",
    "joint pain": "arthralgies", "a swollen, red, hot joint": "une articulation rouge, chaude et gonflée",
    "rash": "éruption cutanée", "itching": "prurit", "dizziness": "vertiges", "syncope": "syncope",
    "back pain": "lombalgie", "calf pain": "douleur du mollet", "hemoptysis": "hémoptysie",
    "melena": "méléna", "low mood": "humeur dépressive", "insomnia": "insomnie",
}

# diagnosis -> symptoms, abnormal labs (direction), abnormal vitals, drugs, procedures, imaging finding
DIAGNOSES: dict[str, dict] = {
    "community-acquired pneumonia": {
        "fr": "pneumopathie aiguë communautaire", "symptoms": ("fever", "productive cough", "shortness of breath", "pleuritic chest pain", "fatigue"),
        "labs": {"white blood cell count": "high", "C-reactive protein": "high", "procalcitonin": "high"},
        "vitals": {"temperature": "high", "respiratory rate": "high", "oxygen saturation": "low"},
        "drugs": ("amoxicillin", "ceftriaxone", "azithromycin", "paracetamol"), "procedures": ("chest radiograph", "blood cultures"),
        "imaging": "a consolidation of the right lower lobe"},
    "acute myocardial infarction": {
        "fr": "infarctus du myocarde", "symptoms": ("crushing chest pain", "diaphoresis", "nausea", "shortness of breath"),
        "labs": {"troponin I": "high"}, "vitals": {"heart rate": "high", "systolic blood pressure": "high"},
        "drugs": ("aspirin", "clopidogrel", "heparin", "atorvastatin", "bisoprolol", "nitroglycerin", "morphine"),
        "procedures": ("coronary angiography", "percutaneous coronary intervention", "electrocardiogram"),
        "imaging": "ST-segment elevation in the inferior leads"},
    "acute decompensated heart failure": {
        "fr": "insuffisance cardiaque aiguë", "symptoms": ("shortness of breath", "orthopnea", "leg swelling", "fatigue"),
        "labs": {"BNP": "high", "sodium": "low", "creatinine": "high"}, "vitals": {"respiratory rate": "high", "oxygen saturation": "low"},
        "drugs": ("furosemide", "spironolactone", "bisoprolol", "ramipril"), "procedures": ("echocardiography", "chest radiograph"),
        "imaging": "bilateral pleural effusions with upper lobe diversion"},
    "pulmonary embolism": {
        "fr": "embolie pulmonaire", "symptoms": ("shortness of breath", "pleuritic chest pain", "calf pain", "hemoptysis", "syncope"),
        "labs": {"D-dimer": "high", "troponin I": "high"}, "vitals": {"heart rate": "high", "oxygen saturation": "low"},
        "drugs": ("enoxaparin", "heparin", "apixaban"), "procedures": ("CT pulmonary angiography", "compression ultrasonography"),
        "imaging": "filling defects in the segmental pulmonary arteries"},
    "acute pancreatitis": {
        "fr": "pancréatite aiguë", "symptoms": ("epigastric pain radiating to the back", "nausea", "vomiting"),
        "labs": {"lipase": "high", "white blood cell count": "high", "C-reactive protein": "high"}, "vitals": {"heart rate": "high", "temperature": "high"},
        "drugs": ("paracetamol", "morphine", "ondansetron"), "procedures": ("abdominal ultrasound", "contrast-enhanced CT"),
        "imaging": "peripancreatic fat stranding without necrosis"},
    "acute cholecystitis": {
        "fr": "cholécystite aiguë", "symptoms": ("right upper quadrant pain", "fever", "nausea", "vomiting"),
        "labs": {"white blood cell count": "high", "C-reactive protein": "high", "total bilirubin": "high", "ALT": "high"},
        "vitals": {"temperature": "high", "heart rate": "high"}, "drugs": ("piperacillin-tazobactam", "metronidazole", "paracetamol"),
        "procedures": ("abdominal ultrasound", "laparoscopic cholecystectomy"), "imaging": "a thickened gallbladder wall with pericholecystic fluid"},
    "pyelonephritis": {
        "fr": "pyélonéphrite aiguë", "symptoms": ("fever", "flank pain", "dysuria", "urinary frequency", "vomiting"),
        "labs": {"white blood cell count": "high", "C-reactive protein": "high", "creatinine": "high"}, "vitals": {"temperature": "high", "heart rate": "high"},
        "drugs": ("ceftriaxone", "ciprofloxacin", "paracetamol"), "procedures": ("urine culture", "renal ultrasound"),
        "imaging": "mild dilatation of the left renal pelvis"},
    "bacterial meningitis": {
        "fr": "méningite bactérienne", "symptoms": ("headache", "fever", "neck stiffness", "photophobia", "confusion"),
        "labs": {"white blood cell count": "high", "C-reactive protein": "high", "lactate": "high"}, "vitals": {"temperature": "high", "heart rate": "high"},
        "drugs": ("ceftriaxone", "vancomycin", "aciclovir", "hydrocortisone"), "procedures": ("lumbar puncture", "head CT"),
        "imaging": "no mass lesion or midline shift"},
    "ischemic stroke": {
        "fr": "accident vasculaire cérébral ischémique", "symptoms": ("unilateral weakness", "slurred speech", "confusion", "dizziness"),
        "labs": {"glucose": "high"}, "vitals": {"systolic blood pressure": "high"},
        "drugs": ("aspirin", "clopidogrel", "atorvastatin"), "procedures": ("head CT", "brain MRI", "carotid Doppler ultrasound"),
        "imaging": "an acute infarct in the left middle cerebral artery territory"},
    "diabetic ketoacidosis": {
        "fr": "acidocétose diabétique", "symptoms": ("polyuria", "polydipsia", "abdominal pain", "vomiting", "confusion", "weight loss"),
        "labs": {"glucose": "high", "potassium": "high", "lactate": "high", "HbA1c": "high"}, "vitals": {"heart rate": "high", "respiratory rate": "high"},
        "drugs": ("insulin glargine", "ondansetron"), "procedures": ("arterial blood gas analysis", "continuous insulin infusion"),
        "imaging": "no acute cardiopulmonary abnormality"},
    "asthma exacerbation": {
        "fr": "exacerbation d'asthme", "symptoms": ("wheezing", "shortness of breath", "dry cough"),
        "labs": {"white blood cell count": "high"}, "vitals": {"respiratory rate": "high", "oxygen saturation": "low", "heart rate": "high"},
        "drugs": ("salbutamol", "prednisolone", "methylprednisolone"), "procedures": ("peak flow measurement", "chest radiograph"),
        "imaging": "hyperinflated lungs without consolidation"},
    "gout": {
        "fr": "crise de goutte", "symptoms": ("a swollen, red, hot joint", "joint pain", "fever"),
        "labs": {"uric acid": "high", "C-reactive protein": "high"}, "vitals": {"temperature": "high"},
        "drugs": ("colchicine", "ibuprofen", "prednisolone", "allopurinol"), "procedures": ("joint aspiration", "dual-energy CT"),
        "imaging": "monosodium urate deposits around the first metatarsophalangeal joint"},
    "upper gastrointestinal bleeding": {
        "fr": "hémorragie digestive haute", "symptoms": ("melena", "dizziness", "syncope", "fatigue", "vomiting"),
        "labs": {"hemoglobin": "low", "urea": "high", "platelet count": "low"}, "vitals": {"heart rate": "high", "systolic blood pressure": "low"},
        "drugs": ("omeprazole", "ondansetron"), "procedures": ("upper endoscopy", "blood transfusion"),
        "imaging": "a bleeding duodenal ulcer with a visible vessel"},
    "hypothyroidism": {
        "fr": "hypothyroïdie", "symptoms": ("fatigue", "weight loss", "low mood", "insomnia"),
        "labs": {"TSH": "high", "sodium": "low"}, "vitals": {"heart rate": "low", "temperature": "low"},
        "drugs": ("levothyroxine",), "procedures": ("thyroid ultrasound",), "imaging": "a diffusely enlarged, heterogeneous thyroid gland"},
    "cellulitis": {
        "fr": "dermohypodermite bactérienne", "symptoms": ("rash", "fever", "leg swelling", "itching"),
        "labs": {"white blood cell count": "high", "C-reactive protein": "high"}, "vitals": {"temperature": "high", "heart rate": "high"},
        "drugs": ("amoxicillin", "doxycycline", "paracetamol"), "procedures": ("skin marking of the erythema", "blood cultures"),
        "imaging": "subcutaneous edema without a collection"},
    "generalized tonic-clonic seizure": {
        "fr": "crise tonico-clonique généralisée", "symptoms": ("seizure", "confusion", "headache"),
        "labs": {"lactate": "high", "sodium": "low"}, "vitals": {"heart rate": "high"},
        "drugs": ("lorazepam", "levetiracetam"), "procedures": ("electroencephalography", "brain MRI"),
        "imaging": "no structural lesion"},
    "atrial fibrillation": {
        "fr": "fibrillation atriale", "symptoms": ("palpitations", "dizziness", "shortness of breath", "fatigue"),
        "labs": {"TSH": "low", "potassium": "low"}, "vitals": {"heart rate": "high"},
        "drugs": ("bisoprolol", "metoprolol", "apixaban", "warfarin"), "procedures": ("electrocardiogram", "echocardiography"),
        "imaging": "an irregularly irregular rhythm without P waves"},
    "major depressive episode": {
        "fr": "épisode dépressif caractérisé", "symptoms": ("low mood", "insomnia", "fatigue", "weight loss"),
        "labs": {}, "vitals": {}, "drugs": ("sertraline",), "procedures": ("psychiatric assessment",),
        "imaging": "no abnormality"},
}

PROCEDURES: dict[str, str] = {
    "chest radiograph": "radiographie thoracique", "blood cultures": "hémocultures",
    "coronary angiography": "coronarographie", "percutaneous coronary intervention": "angioplastie coronaire",
    "electrocardiogram": "électrocardiogramme", "echocardiography": "échocardiographie",
    "CT pulmonary angiography": "angioscanner thoracique", "compression ultrasonography": "échographie de compression",
    "abdominal ultrasound": "échographie abdominale", "contrast-enhanced CT": "scanner injecté",
    "laparoscopic cholecystectomy": "cholécystectomie cœlioscopique", "urine culture": "ECBU",
    "renal ultrasound": "échographie rénale", "lumbar puncture": "ponction lombaire", "head CT": "scanner cérébral",
    "brain MRI": "IRM cérébrale", "carotid Doppler ultrasound": "écho-Doppler des troncs supra-aortiques",
    "arterial blood gas analysis": "gaz du sang artériel", "continuous insulin infusion": "insulinothérapie continue",
    "peak flow measurement": "mesure du débit expiratoire de pointe", "joint aspiration": "ponction articulaire",
    "dual-energy CT": "scanner double énergie", "upper endoscopy": "endoscopie digestive haute",
    "blood transfusion": "transfusion sanguine", "thyroid ultrasound": "échographie thyroïdienne",
    "skin marking of the erythema": "délimitation de l'érythème", "electroencephalography": "électroencéphalogramme",
    "psychiatric assessment": "évaluation psychiatrique",
}

# allergen -> reactions
ALLERGIES: dict[str, tuple[str, ...]] = {
    "penicillin": ("urticaria", "anaphylaxis", "a maculopapular rash"),
    "sulfonamides": ("a maculopapular rash", "Stevens-Johnson syndrome"),
    "iodinated contrast": ("urticaria", "bronchospasm"),
    "latex": ("contact dermatitis", "urticaria"),
    "peanuts": ("angioedema", "anaphylaxis"),
    "aspirin": ("bronchospasm", "angioedema"),
    "codeine": ("nausea and vomiting", "pruritus"),
    "shellfish": ("urticaria", "anaphylaxis"),
}

COMORBIDITIES: dict[str, str] = {
    "type 2 diabetes mellitus": "diabète de type 2", "hypertension": "hypertension artérielle",
    "hypercholesterolemia": "hypercholestérolémie", "chronic obstructive pulmonary disease": "BPCO",
    "chronic kidney disease": "insuffisance rénale chronique", "obesity": "obésité", "asthma": "asthme",
    "hypothyroidism": "hypothyroïdie", "atrial fibrillation": "fibrillation atriale",
    "osteoarthritis": "arthrose", "depression": "dépression", "gastro-esophageal reflux disease": "reflux gastro-œsophagien",
    "rheumatoid arthritis": "polyarthrite rhumatoïde", "prior appendectomy": "antécédent d'appendicectomie",
}

# unit -> (min, max) counts and French unit
DURATIONS: dict[str, dict] = {
    "hours": {"range": (2, 48), "fr": "heures"},
    "days": {"range": (2, 14), "fr": "jours"},
    "weeks": {"range": (1, 8), "fr": "semaines"},
    "months": {"range": (1, 6), "fr": "mois"},
}

SETTINGS: dict[str, str] = {
    "emergency department": "aux urgences", "outpatient clinic": "en consultation",
    "general practitioner": "chez son médecin traitant", "acute medical unit": "en unité d'hospitalisation de courte durée",
}

OCCUPATIONS: dict[str, str] = {
    "retired teacher": "enseignant retraité", "farmer": "agriculteur", "nurse": "infirmier",
    "construction worker": "ouvrier du bâtiment", "office worker": "employé de bureau", "student": "étudiant",
    "truck driver": "chauffeur routier", "cook": "cuisinier", "accountant": "comptable",
}

OUTCOMES: dict[str, str] = {
    "made a full recovery": "a guéri sans séquelle",
    "improved steadily and was discharged": "s'est progressivement amélioré et est sorti",
    "required a prolonged admission but recovered": "a nécessité une hospitalisation prolongée mais s'est rétabli",
    "was transferred to the intensive care unit and later recovered": "a été transféré en réanimation puis s'est rétabli",
    "had a recurrence that responded to a second course of treatment": "a récidivé puis répondu à un second traitement",
    "remained symptom-free at follow-up": "est resté asymptomatique lors du suivi",
}
