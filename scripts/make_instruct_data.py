#!/usr/bin/env python3
"""Writes a small generated instruction dataset (no downloads) for examples/instruct-chat.yaml:

  chat.jsonl         conversations {"messages": [{"role", "content"}, ...]} (system, user and
                     assistant turns; one to three exchanges each)
  completions.jsonl  prompt/completion pairs {"prompt": ..., "completion": ...}

The tasks are simple and learnable by a tiny model from bytes: arithmetic, word reversal, colour
mixing, opposites, counting letters, capitals of made-up countries. Deterministic (seeded).
usage: make_instruct_data.py [OUT_DIR] [--conversations N] [--pairs N] [--seed S]
"""
import argparse
import json
import os
import random

OPPOSITES = [("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"), ("day", "night"),
             ("open", "closed"), ("light", "dark"), ("early", "late"), ("full", "empty"),
             ("happy", "sad"), ("left", "right"), ("old", "new")]
MIXES = {("red", "blue"): "purple", ("red", "yellow"): "orange", ("blue", "yellow"): "green",
         ("red", "white"): "pink", ("black", "white"): "grey", ("blue", "white"): "light blue"}
WORDS = ["apple", "river", "stone", "garden", "window", "planet", "candle", "forest", "silver",
         "bridge", "pencil", "rocket", "orange", "violin", "market", "turtle"]
COUNTRIES = {"Norland": "Frostby", "Aurelia": "Solmar", "Kestria": "Vell", "Maridon": "Port Azul",
             "Tavora": "Quill", "Zenthia": "Orrin", "Borvia": "Kalt", "Elandor": "Mirefall"}
SYSTEMS = ["You are a helpful assistant. Answer briefly.", "You are a concise tutor.",
           "Answer in one short sentence."]


def task(rng):
    """One (question, answer) exchange."""
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        if rng.random() < 0.5:
            return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
        a, b = max(a, b), min(a, b)
        return f"What is {a} minus {b}?", f"{a} minus {b} is {a - b}."
    if kind == 1:
        w = rng.choice(WORDS)
        return f"Reverse the word '{w}'.", f"'{w}' reversed is '{w[::-1]}'."
    if kind == 2:
        (x, y), z = rng.choice(list(MIXES.items()))
        return f"What colour do {x} and {y} make?", f"Mixing {x} and {y} makes {z}."
    if kind == 3:
        x, y = rng.choice(OPPOSITES)
        if rng.random() < 0.5:
            x, y = y, x
        return f"What is the opposite of '{x}'?", f"The opposite of '{x}' is '{y}'."
    if kind == 4:
        w = rng.choice(WORDS)
        c = rng.choice(sorted(set(w)))
        return (f"How many times does the letter '{c}' appear in '{w}'?",
                f"The letter '{c}' appears {w.count(c)} time{'s' if w.count(c) != 1 else ''} in '{w}'.")
    country, capital = rng.choice(list(COUNTRIES.items()))
    return f"What is the capital of {country}?", f"The capital of {country} is {capital}."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default=os.path.join(os.path.dirname(__file__), "..",
                                                                "examples", "instruct"))
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    chat = os.path.join(args.out_dir, "chat.jsonl")
    with open(chat, "w", encoding="utf-8") as f:
        for _ in range(args.conversations):
            messages = []
            if rng.random() < 0.4:
                messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
            for _ in range(rng.randint(1, 3)):
                q, a = task(rng)
                messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    pairs = os.path.join(args.out_dir, "completions.jsonl")
    with open(pairs, "w", encoding="utf-8") as f:
        for _ in range(args.pairs):
            q, a = task(rng)
            f.write(json.dumps({"prompt": f"Question: {q}\nAnswer:", "completion": " " + a},
                               ensure_ascii=False) + "\n")
    print(f"wrote {args.conversations} conversations to {chat} and {args.pairs} pairs to {pairs}")


if __name__ == "__main__":
    main()
