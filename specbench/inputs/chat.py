"""Turn a conversation into prompt ids: the tokenizer's chat template, or a named template."""

from __future__ import annotations

from specbench.errors import SettingsError

# FastChat's "vicuna_v1.1" template, which Spec-Bench uses for Vicuna v1.3.
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)
TEMPLATES = ("auto", "vicuna", "plain")


def check_template(template: str) -> None:
    if template not in TEMPLATES:
        raise SettingsError(f"unknown chat template '{template}'. Valid: {', '.join(TEMPLATES)} "
                            f"(model.chat_template=...)")


def opening(question) -> list[dict]:
    """The messages a question's conversation starts with: its system prompt where it has one (an
    agent's tool descriptions), else none, so that the chat template puts its own default."""
    return [{"role": "system", "content": question.system}] if getattr(question, "system", None) else []


def first_turn(question) -> list[dict]:
    """The messages of a question's first prompt: its opening and its first user turn."""
    return opening(question) + [{"role": "user", "content": question.turns[0]}]


def vicuna_prompt(messages: list[dict]) -> str:
    # a system message replaces FastChat's default system line, as FastChat's own conversations do
    system = next((m["content"] for m in messages if m["role"] == "system"), VICUNA_SYSTEM)
    text = system + " "
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "user":
            text += "USER: " + m["content"] + " "
        else:
            text += "ASSISTANT: " + m["content"] + "</s>"
    return text + "ASSISTANT:"


def prompt_ids(tokenizer, messages: list[dict], template: str = "auto") -> list[int]:
    """messages: [{'role': 'system', ...}?, {'role': 'user'|'assistant', 'content': str}, ...] ending with
    a user turn; a system message, if any, first."""
    check_template(template)
    if template == "vicuna":
        return tokenizer(vicuna_prompt(messages)).input_ids
    if template == "plain" or (template == "auto" and not tokenizer.chat_template):
        return tokenizer("\n\n".join(m["content"] for m in messages)).input_ids
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def answer_text(tokenizer, tokens: list[int]) -> str:
    """A turn's answer as Spec-Bench/FastChat keep it for the next turn's prompt: decoded without
    spaces around special tokens, every special-token string of the tokenizer removed, whitespace
    stripped. MT-bench's turn-2 prompt is built from this text, so it matches theirs byte for byte."""
    text = tokenizer.decode(tokens, spaces_between_special_tokens=False)
    for special in tokenizer.special_tokens_map.values():
        for s in special if isinstance(special, list) else [special]:
            text = text.replace(s, "")
    return text.strip()


def last_prompt_tokens(tokenizer, question, template: str = "auto") -> int:
    """The length of a question's last prompt with every earlier answer empty (roles alternate, as
    strict chat templates demand), its system prompt included: what a window check adds the answers to
    (run/prompts.py prompt_bound, inputs/window.py check_sessions_fit). A one-turn question's prompt."""
    messages = opening(question)
    for text in question.turns:
        messages += [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    return len(prompt_ids(tokenizer, messages[:-1], template))
