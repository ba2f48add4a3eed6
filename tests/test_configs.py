"""Every family's config file round-trips through bert.JsonConfig, the JSON methods they share,
and its errors name the family, the file and what was expected."""

import json

import pytest

from data_prep.errors import InputError
from modeling import albert, bart, bert, electra, elmo, gpt, t5, xlnet

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# Each shipped config file and the class that reads it.
SHIPPED = [
    ("bert_tiny.json", bert.BertConfig),
    ("roberta_base.json", bert.BertConfig),
    ("albert_tiny.json", albert.AlbertConfig),
    ("electra_small.json", electra.ElectraConfig),
    ("gpt_tiny.json", gpt.GptConfig),
    ("t5_tiny.json", t5.T5Config),
    ("bart_tiny.json", bart.BartConfig),
    ("xlnet_tiny.json", xlnet.XLNetConfig),
    ("elmo_tiny.json", elmo.ElmoConfig),
]


@pytest.mark.parametrize("name, cls", SHIPPED, ids=[n for n, _ in SHIPPED])
def test_shipped_configs_round_trip_and_name_their_family_in_errors(tmp_path, name, cls):
    assert issubclass(cls, bert.JsonConfig)
    path = ROOT / "configs" / name
    config = cls.from_json_file(path)
    # The file's keys come back with their values (BERT and ELMo leave out the optional ones a
    # file left out; the others write every field).
    written, values = config.to_dict(), json.loads(path.read_text())
    assert {k: written[k] for k in values} == values
    again = tmp_path / name
    again.write_text(config.to_json_string())
    assert again.read_text().endswith("}\n") and cls.from_json_file(again) == config
    assert cls.from_dict(config.to_dict()) == config
    first = next(iter(config.to_dict()))
    changed = config.replace(**{first: getattr(config, first)})
    assert changed == config and changed is not config

    with pytest.raises(InputError, match=rf"nothing\.json: expected {cls.FILE_KIND}, found no"):
        cls.from_json_file(tmp_path / "nothing.json")
    with pytest.raises(InputError, match=rf"{name}: unknown key\(s\) \['speed'\]; a {cls.FAMILY} "):
        cls.from_dict({**config.to_dict(), "speed": 1}, name)
    (tmp_path / "broken.json").write_text('{\n  "vocab_size": 3,\n}\n')
    with pytest.raises(InputError, match=r"broken\.json:3: expected JSON, found a syntax error"):
        cls.from_json_file(tmp_path / "broken.json")


def test_each_family_names_itself():
    families = [cls.FAMILY for _, cls in SHIPPED[1:]]
    assert families == ["BERT", "ALBERT", "ELECTRA", "GPT", "T5", "BART", "XLNet", "ELMo"]
    assert len({cls.FILE_KIND for _, cls in SHIPPED[1:]}) == 8
