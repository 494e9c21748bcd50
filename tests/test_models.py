"""The tiny model is a real Hugging Face model directory, deterministic for a seed."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from grpo_trainer.models import build_tiny_model, load_model, load_tokenizer


def test_tiny_model_loads_with_auto_classes(tmp_path: Path) -> None:
    build_tiny_model(tmp_path / "m", seed=3)
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert model.config.model_type == "qwen2"
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "repeat 7"}], add_generation_prompt=True, return_dict=False
    )
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    out = model(torch.tensor([prompt])).logits
    assert out.shape == (1, len(prompt), len(tok))


def test_tokenizer_same_under_every_loading_class(tmp_path: Path) -> None:
    build_tiny_model(tmp_path / "m")
    auto = load_tokenizer(tmp_path / "m")
    plain = PreTrainedTokenizerFast.from_pretrained(tmp_path / "m")
    for text in ["repeat 7: 777777", "two words\n\n  x", "0123456789"]:
        ids = auto(text).input_ids
        assert ids == plain(text).input_ids
        assert auto.decode(ids) == text
        assert len(ids) == len(text)


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path) -> None:
    a = load_model(build_tiny_model(tmp_path / "a", seed=1))
    b = load_model(build_tiny_model(tmp_path / "b", seed=1))
    c = load_model(build_tiny_model(tmp_path / "c", seed=2))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert any(
        not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True)
    )


def test_final_norm_weight_scales_the_logits_and_nothing_else(tmp_path: Path) -> None:
    """The weight multiplies the last hidden state, so every logit (the tied head's bound
    included) scales with it, and it survives the save/load round trip."""
    qwen_init = load_model(build_tiny_model(tmp_path / "one", seed=4, final_norm_weight=1.0))
    default = load_model(build_tiny_model(tmp_path / "six", seed=4))
    assert torch.equal(default.model.norm.weight, torch.full((64,), 6.0))
    ids = torch.tensor([load_tokenizer(tmp_path / "six")("repeat 7: 777").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(default(ids).logits, 6.0 * qwen_init(ids).logits)


def test_padded_vocabulary_decodes_every_id_and_encodes_as_before(tmp_path: Path) -> None:
    from grpo_trainer.envs.tokenizer import FastTokenizer
    from grpo_trainer.models import build_tiny_tokenizer

    size = 5000
    build_tiny_tokenizer(vocab_size=size).save_pretrained(tmp_path / "t")
    plain = build_tiny_tokenizer()
    for loaded in (
        AutoTokenizer.from_pretrained(tmp_path / "t"),
        FastTokenizer.from_dir(tmp_path / "t"),
    ):
        text = "repeat 7: 777777 ab"
        assert loaded.encode(text) == plain.encode(text)  # fillers never come out of encode
        tail = loaded.decode(list(range(size - 50, size)))
        assert len(tail) >= 100 and tail.isalnum()  # every filler decodes to its text
    assert len(AutoTokenizer.from_pretrained(tmp_path / "t")) == size


def test_bfloat16_build_is_the_float32_build_cast(tmp_path: Path) -> None:
    """``dtype = "bfloat16"`` (profiles/qwen2.5-7b-1gpu.toml) saves the same initialisation
    in half the bytes: every tensor is the float32 build's, rounded to bf16."""
    from safetensors.torch import load_file

    full = load_file(build_tiny_model(tmp_path / "f32", seed=3) / "model.safetensors")
    half = load_file(
        build_tiny_model(tmp_path / "bf16", seed=3, dtype="bfloat16") / "model.safetensors"
    )
    assert full.keys() == half.keys()
    for name, tensor in half.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, full[name].to(torch.bfloat16)), name
    config = (tmp_path / "bf16" / "config.json").read_text()
    assert '"dtype": "bfloat16"' in config  # what vLLM's --dtype auto would pick
