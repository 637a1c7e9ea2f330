"""The Aozora Bunko cleaner on a small made-up sample, and whitespace/NFKC normalisation."""

import pytest

from anchormass.data.cleaners import aozora, get_cleaners, nfkc, whitespace
from anchormass.errors import ConfigError

SAMPLE = (
    "試験の本\r\n作者太郎\r\n\r\n"
    "-------------------------------------------------------\r\n"
    "【テキスト中に現れる記号について】\r\n《》：ルビ\r\n（例）猫《ねこ》\r\n"
    "-------------------------------------------------------\r\n\r\n"
    "［＃５字下げ］一［＃「一」は中見出し］\r\n\r\n"
    "　吾輩《わがはい》は猫である。一番｜獰悪《どうあく》な書生だ。\r\n"
    "　※［＃「言＋墟のつくり」、第4水準2-88-74］を見た。\r\n\r\n\r\n\r\n"
    "底本：「試験全集」架空書房\r\n入力：誰か\r\n"
)


def test_aozora_strips_markup_header_and_footer():
    out = aozora(SAMPLE)
    assert out == "試験の本\n作者太郎\n\n一\n\n吾輩は猫である。一番獰悪な書生だ。\nを見た。"
    for mark in ("《", "》", "｜", "［＃", "※", "底本", "ルビ", "\r"):
        assert mark not in out


def test_aozora_without_header_keeps_text():
    assert aozora("猫《ねこ》が居る。\n") == "猫が居る。"


def test_whitespace_and_nfkc():
    assert whitespace("a  \r\n\r\n\r\n\r\n　b\t") == "a\n\nb"
    assert nfkc("ＡＢＣ１２３ｶﾀ") == "ABC123カタ"


def test_unknown_cleaner_is_config_error():
    with pytest.raises(ConfigError, match="unknown cleaner"):
        get_cleaners(["aozora", "nope"])
