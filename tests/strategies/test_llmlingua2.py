"""llmlingua2: the llmlingua package's LLMLingua-2 compressor, loaded from a local directory.

There are no trained weights here: the tests build a tiny randomly initialised BERT token
classifier (2 layers, hidden 32, two labels, a WordPiece vocabulary of a few hundred
entries) and save it to a temporary directory. They prove the loading and compression path
(budget held by the runner's counter, system and query intact, one usage line for a
missing or bad directory, nothing fetched from the network), not compression quality.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import string
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_budgetbench.errors import ConfigError
from pytest_budgetbench.messages import Message, split_ends, text_of
from pytest_budgetbench.strategies import llmlingua2 as lingua
from pytest_budgetbench.strategies import load_strategy
from pytest_budgetbench.strategies.base import Regime, StrategyContext
from pytest_budgetbench.strategies.llmlingua2 import (
    LLMLINGUA2_MODEL,
    LLMLingua2,
    compressor_for,
    forget_compressors,
)
from pytest_budgetbench.testing import HashingEmbedder, check_strategy
from pytest_budgetbench.tokens.approximate import ApproxCounter
from pytest_budgetbench.tokens.base import TokenCounter
from tests.fake_openai import FakeOpenAI
from tests.strategy_helpers import graded_sweep, memory_items
from tests.sweeps import sweep_args

pytest.importorskip("llmlingua")
pytest.importorskip("tokenizers")

COMMON_WORDS = (
    "the a an i my me you your we it is was are be have had do did not no yes and or but "
    "to of in on at for with from about as by this that what which who when where how now "
    "called name city live lives moved friend asked ideas garden tips saving money please "
    "remember noted could give short breaks so stay fresh compare two three options first "
    "use already home ask join helps reply just turtle dog cat parrot assistant user "
    "helpful answer conversation if never said unknown plans notes keeps talked"
)
WORDS = COMMON_WORDS.split()  # whole words in the vocabulary; others are spelt in pieces


def build_tiny_model(directory: Path, *, hidden: int = 32, layers: int = 2, heads: int = 2,
                     words: Iterable[str] = ()) -> Path:
    """A random BERT token classifier with a WordPiece tokenizer, saved to ``directory``
    (``benchmarks/bench_llmlingua2.py`` builds it at a trained release's layer shape, with
    ``words`` more whole words in its vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForTokenClassification, PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    characters = string.ascii_letters + string.digits
    vocab = list(dict.fromkeys([*special, *characters, *string.punctuation,
                                *("##" + c for c in characters), *WORDS, *words]))
    wordpiece = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)},
                                           unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    wordpiece.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]")
    tokenizer.save_pretrained(directory)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden,
                        max_position_embeddings=512, num_labels=2, pad_token_id=0)
    import torch

    torch.manual_seed(0)
    BertForTokenClassification(config).save_pretrained(directory)
    return directory


def build_tiny_xlm_roberta(directory: Path, *, hidden: int = 32, layers: int = 2,
                           heads: int = 2, words: Iterable[str] = ()) -> Path:
    """The other family llmlingua knows: XLM-RoBERTa with a SentencePiece-style unigram
    vocabulary (``▁`` starts a word)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import (
        PreTrainedTokenizerFast,
        XLMRobertaConfig,
        XLMRobertaForTokenClassification,
    )

    special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    characters = string.ascii_letters + string.digits + string.punctuation
    whole = dict.fromkeys([*WORDS, *words])
    pieces = [*((s, 0.0) for s in special), *(("\u2581" + w, -2.0) for w in whole),
              *((c, -5.0) for c in characters), ("\u2581", -3.0)]
    unigram = Tokenizer(models.Unigram(pieces, unk_id=3))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    unigram.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    PreTrainedTokenizerFast(
        tokenizer_object=unigram, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>",
    ).save_pretrained(directory)
    config = XLMRobertaConfig(vocab_size=len(pieces), hidden_size=hidden,
                              num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=4 * hidden,
                              max_position_embeddings=514, num_labels=2, pad_token_id=1)
    XLMRobertaForTokenClassification(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llmlingua2"))


class NetworkAttempts(list[str]):
    """Every non-loopback connection or lookup tried, and every tiktoken encoding asked for."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkAttempts]:
    """Refuse (and record) any connection or name lookup off this machine, and any tiktoken
    encoding (llmlingua's PromptCompressor.__init__ would download one)."""
    import tiktoken

    attempts = NetworkAttempts()
    local = {"127.0.0.1", "::1", "localhost"}
    real_connect, real_lookup = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and address[0] not in local:
            attempts.append(f"connect {address}")
            raise OSError(f"test: no network ({address})")
        return real_connect(self, address)

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in local and host is not None:
            attempts.append(f"lookup {host}")
            raise OSError(f"test: no network ({host})")
        return real_lookup(host, *args, **kwargs)

    def encoding(name: str, *args: Any, **kwargs: Any) -> Any:
        attempts.append(f"tiktoken {name}")
        raise AssertionError(f"test: tiktoken encoding {name} asked for")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(tiktoken, "get_encoding", encoding)
    monkeypatch.setattr(tiktoken, "encoding_for_model", encoding)
    yield attempts
    assert attempts == []


@pytest.fixture(autouse=True)
def fresh_compressors() -> Iterator[None]:
    forget_compressors()
    yield
    forget_compressors()


def _context(tokens: TokenCounter, model: Path | str, **options: Any) -> StrategyContext:
    return StrategyContext(tokens=tokens, embedder_factory=HashingEmbedder,
                           options={"llmlingua2_model": str(model), **options})


def _run(messages: list[Message], budget: int, model: Path | str, **options: Any
         ) -> tuple[list[Message], dict[str, Any]]:
    tokens = ApproxCounter()
    context = _context(tokens, model, **options)
    strategy = LLMLingua2()
    strategy.reset(context)
    return strategy.apply(messages, budget), context.info["llmlingua2"]


def _item(index: int = 0, history_tokens: int = 900) -> list[Message]:
    return list(memory_items(index + 1, history_tokens)[index].messages)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def _is_subsequence(short: list[str], long: list[str]) -> bool:
    remaining = iter(long)
    return all(word in remaining for word in short)


def test_is_a_registered_local_strategy_reset_per_item() -> None:
    assert isinstance(load_strategy("llmlingua2"), LLMLingua2)
    assert LLMLingua2.regimes == {Regime.LOCAL_ONLY, Regime.RESET_PER_ITEM}
    assert LLMLINGUA2_MODEL.required and LLMLINGUA2_MODEL.default is None


def test_conforms(model_dir: Path) -> None:
    check_strategy(LLMLingua2, context_factory=lambda tokens, _budget: _context(tokens, model_dir),
                   max_examples=12)


def test_a_prompt_that_fits_is_sent_unchanged_and_loads_no_model(model_dir: Path) -> None:
    messages = _item(history_tokens=200)
    prompt, info = _run(messages, 10_000, model_dir)
    assert prompt == messages
    assert info["passes"] == 0 and info["tokens_before"] == info["tokens_after"]
    assert lingua._COMPRESSORS == {}  # lazily: only a prompt over budget loads it


def test_compresses_the_history_into_the_budget_keeping_system_and_query(
    model_dir: Path,
) -> None:
    messages = _item()
    tokens = ApproxCounter()
    before = tokens.count_messages(messages)
    budget = before * 6 // 10
    prompt, info = _run(messages, budget, model_dir)
    assert tokens.count_messages(prompt) <= budget
    head, history, query = split_ends(messages)
    assert prompt[: len(head)] == head and prompt[-1] == query[-1]
    compressed = prompt[len(head) : -1]
    assert compressed and len(compressed) <= len(history)
    # Each message is its own words, fewer of them, in their order, with its role.
    sources = iter(history)
    for message in compressed:
        source = next(s for s in sources if s["role"] == message["role"]
                      and _is_subsequence(_words(text_of(message)), _words(text_of(s))))
        assert len(_words(text_of(message))) <= len(_words(text_of(source)))
    assert sum(len(_words(text_of(m))) for m in compressed) < sum(
        len(_words(text_of(m))) for m in history)
    assert info["passes"] == 1 and 0 < info["rates"][0] < 1 and not info["trimmed"]
    assert info["tokens_before"] == before
    assert info["tokens_after"] == tokens.count_messages(prompt)
    assert info["seconds"] > 0 and info["load_seconds"] > 0


def test_an_xlm_roberta_classifier_takes_the_same_path(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    directory = build_tiny_xlm_roberta(tmp_path_factory.mktemp("tiny-xlmr"))
    messages = _item()
    budget = ApproxCounter().count_messages(messages) // 2
    prompt, info = _run(messages, budget, LLMLINGUA2_MODEL.read(str(directory), "test"))
    assert ApproxCounter().count_messages(prompt) <= budget and info["passes"] >= 1
    history = split_ends(messages)[1]
    kept = " ".join(text_of(m) for m in prompt[1:-1])
    # Words come back whole and spaced (its "\u2581" rules), not glued or split.
    assert set(_words(kept)) <= {w for m in history for w in _words(text_of(m))}


def test_a_tool_exchange_keeps_its_messages_when_compressed_to_nothing() -> None:
    history: list[Message] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "calling", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "result", "tool_call_id": "c1"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    ]
    rebuilt = lingua._rebuilt(history, [0, 1, 2], ["", "", "res"])
    assert [m["role"] for m in rebuilt] == ["assistant", "tool", "user"]
    assert rebuilt[0]["content"] == "" and rebuilt[0]["tool_calls"] == [{"id": "c1"}]
    assert rebuilt[1] == {"role": "tool", "content": "res", "tool_call_id": "c1"}
    assert rebuilt[2] == history[3]


def test_the_model_is_loaded_once_per_process_and_directory(model_dir: Path) -> None:
    messages = _item()
    _prompt, first = _run(messages, 300, model_dir)
    _prompt, second = _run(_item(1), 250, model_dir)
    assert first["load_seconds"] > 0 and second["load_seconds"] == 0
    assert list(lingua._COMPRESSORS) == [str(model_dir)]


def test_a_pass_that_misses_is_followed_by_one_at_a_lower_rate(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lingua, "_rate", lambda _target, _tokens: 0.9)  # asks too much
    messages = _item()
    budget = ApproxCounter().count_messages(messages) // 2
    prompt, info = _run(messages, budget, model_dir)
    assert ApproxCounter().count_messages(prompt) <= budget
    # The second rate is the first scaled by how far it missed (what is left over, if
    # any, the packer cuts).
    assert info["passes"] == 2 and info["rates"][0] == 0.9 and info["rates"][1] < 0.5


def test_when_the_passes_run_out_the_oldest_history_is_dropped(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lingua, "_rate", lambda _target, _tokens: 0.9)
    messages = _item()
    budget = ApproxCounter().count_messages(messages) // 2
    prompt, info = _run(messages, budget, model_dir, llmlingua2_passes=1)
    assert ApproxCounter().count_messages(prompt) <= budget
    assert info["passes"] == 1 and info["trimmed"]
    head, history, query = split_ends(messages)
    assert prompt[: len(head)] == head and prompt[-1] == query[-1]
    newest, oldest = text_of(prompt[-2]), text_of(prompt[len(head)])
    assert _is_subsequence(_words(newest), _words(text_of(history[-1])))
    assert not _is_subsequence(_words(oldest), _words(text_of(history[0])))


def test_loading_keeps_the_process_random_state(model_dir: Path) -> None:
    import random

    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    compressor_for(str(model_dir))  # llmlingua seeds everything with 42 here
    assert [random.random() for _ in range(3)] == expected


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def _edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda d: shutil.rmtree(d), "is not a directory"),
        (lambda d: (d / "config.json").unlink(), "has no readable config.json"),
        (lambda d: _edit_config(d, architectures=["BertForMaskedLM"]),
         "hold no ...ForTokenClassification"),
        (lambda d: _edit_config(d, model_type="gpt2"), "its model_type is 'gpt2'"),
        (lambda d: _edit_config(d, max_position_embeddings=128), "takes 128 positions"),
        (lambda d: (d / "model.safetensors").unlink(), "holds no weights"),
        (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
         "holds no tokenizer"),
        (lambda d: (d / "model.safetensors").write_bytes(b"not safetensors"),
         "no token-classification head"),
    ],
)
def test_a_directory_without_a_loadable_classifier_is_rejected_naming_the_option(
    model_dir: Path, tmp_path: Path, spoil: Any, problem: str,
) -> None:
    directory = _copy(model_dir, tmp_path)
    spoil(directory)
    with pytest.raises(ConfigError) as raised:
        LLMLINGUA2_MODEL.read(str(directory), "--budgetbench-strategy-options: llmlingua2_model")
    message = str(raised.value)
    assert problem in message and "llmlingua2_model" in message
    assert "microsoft/llmlingua-2-xlm-roberta-large-meetingbank" in message
    assert "\n" not in message


def test_weights_that_fail_to_load_are_one_config_error_not_retried(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory = _copy(model_dir, tmp_path)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    weights.write_bytes(data[: header + 16])  # the header lists the tensors; the data is cut
    checked = LLMLINGUA2_MODEL.read(str(directory), "llmlingua2_model")
    with pytest.raises(ConfigError, match=r"llmlingua2_model=.*could not load"):
        compressor_for(checked)
    monkeypatch.setattr(lingua, "_load", lambda _d: pytest.fail("loaded again"))
    with pytest.raises(ConfigError, match="could not load"):
        compressor_for(checked)


# -- the sweep -------------------------------------------------------------------------
def test_sweep_holds_the_budget_by_the_runners_count_and_records_the_compression(
    pytester: pytest.Pytester, tmp_path: Path, model_dir: Path, no_network: NetworkAttempts,
) -> None:
    rows = graded_sweep(pytester, tmp_path, None, 4,
                        "--budgets=256,512", "--budgetbench-items=2",
                        "--budgetbench-strategies=llmlingua2",
                        f"--budgetbench-strategy-options=llmlingua2_model={model_dir}",
                        "--budgetbench-task-options=history_tokens=900")
    for row in rows:
        info = row["strategy_info"]["llmlingua2"]
        assert info["tokens_after"] == row["counted_tokens"]  # the runner's own count
        assert info["tokens_before"] > row["budget"] and info["passes"] >= 1
        assert row["aux_calls"] == [] and row["regime"] == "local-only,reset-per-item"
    assert sum(r["strategy_info"]["llmlingua2"]["load_seconds"] > 0 for r in rows) == 1
    # Every cell was answered by the fake endpoint, and nothing else was reached.
    assert no_network == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), "*strategy 'llmlingua2' needs llmlingua2_model, the directory of a trained "
             "LLMLingua-2 token-classification model*: pass "
             "--budgetbench-strategy-options=llmlingua2_model=DIR*"),
        (("--budgetbench-strategy-options=llmlingua2_model=nowhere",),
         "*llmlingua2_model (strategy 'llmlingua2') must be a directory holding an "
         "LLMLingua-2 token-classification model, but nowhere is not a directory; download*"),
    ],
)
def test_a_missing_or_bad_model_directory_is_one_usage_line_before_any_cell(
    pytester: pytest.Pytester, tmp_path: Path, options: tuple[str, ...], expected: str,
) -> None:
    fake = FakeOpenAI().start()
    try:
        result = pytester.runpytest(*sweep_args(
            fake, tmp_path, "--budgets=256", "--budgetbench-items=1",
            "--budgetbench-strategies=truncation,llmlingua2", *options))
    finally:
        fake.stop()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert len(errors) == 1
    result.stderr.fnmatch_lines([expected])
    assert fake.requests == [] and not list((tmp_path / "out").glob("*/cells.jsonl"))
