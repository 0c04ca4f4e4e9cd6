"""Grammars and the fake vocabulary's tokenizer shared by the structured-output tests."""

LETTERS = "abcdefg"  # the fake engines' vocabulary, one letter a token
EOS = 7


def fake_tokenizer():
    """A `tokenizers` word-level tokenizer of the fake vocabulary (llguidance reads it token by token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(LETTERS)} | {"</s>": EOS}, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return tok


# ---- tiny exported engines ------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["x", "yy", "zzz"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "tags", "ok"],
    "additionalProperties": False,
}


LARK = 'start: "call " NAME "(" ARG ("," ARG)* ")"\nNAME: /[a-z]{1,6}/\nARG: /[0-9]{1,3}/'
