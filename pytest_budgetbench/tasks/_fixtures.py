"""Small fixtures in each benchmark's official schema, generated in code.

The project ships no benchmark data (several licences forbid it); tests, examples and
users without the official files can write these instead and point
``--budgetbench-data-<task>`` at them. Every record follows its upstream schema field by
field; the contents are invented.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def filler(topic: str, sentences: int) -> str:
    """Deterministic, readable padding text about ``topic``."""
    return " ".join(
        f"Note {i} on {topic}: the figures for period {i} were checked and filed as usual."
        for i in range(sentences)
    )


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- LongBench v2: data.json ------------------------------------------------------------------
def longbench_v2_records() -> list[dict[str, Any]]:
    rows = []
    for index, (difficulty, length) in enumerate(
        [("easy", "short"), ("hard", "short"), ("hard", "medium")]
    ):
        fact = f"The vault code of report {index} is {4100 + index}."
        context = f"{filler('the archive', 30)}\n\n{fact}\n\n{filler('the ledger', 30)}"
        rows.append({
            "_id": f"fixture-lb2-{index}",
            "domain": "Single-Document QA",
            "sub_domain": "Financial",
            "difficulty": difficulty,
            "length": length,
            "question": f"What is the vault code of report {index}?",
            "choice_A": str(4000 + index),
            "choice_B": str(4100 + index),
            "choice_C": str(4200 + index),
            "choice_D": str(4300 + index),
            "answer": "B",
            "context": context,
        })
    return rows


# -- LongMemEval: longmemeval_oracle.json / longmemeval_s.json -------------------------------------
def _session(user: str, assistant: str, has_answer: bool = False) -> list[dict[str, Any]]:
    turn: dict[str, Any] = {"role": "user", "content": user}
    if has_answer:
        turn["has_answer"] = True
    return [turn, {"role": "assistant", "content": assistant}]


def longmemeval_records() -> list[dict[str, Any]]:
    small_talk = _session("Can you suggest a name for a sourdough starter?",
                          "How about 'Clint Yeastwood'? " + filler("bread", 12))
    specs = [
        ("e47becba", "single-session-user", "What degree did I graduate with?",
         "Business Administration",
         _session("I graduated with a degree in Business Administration.", "Congratulations!",
                  True)),
        ("gpt4_2655b836", "temporal-reasoning",
         "How many days passed between my two dentist visits?",
         "7 days. 8 days (including the last day) is also acceptable.",
         _session("I saw the dentist on March 3 and again on March 10.", "Noted.", True)),
        ("6a1eabeb", "knowledge-update", "Where do I keep my bike now?", "In the garage",
         _session("I moved my bike from the hallway to the garage.", "Good idea.", True)),
        ("8a2466db", "single-session-preference", "Can you recommend a show for tonight?",
         "The user would prefer suggestions of Korean historical dramas, like the ones they "
         "said they enjoyed.",
         _session("I love Korean historical dramas.", "They are great!", True)),
        ("09ba9854_abs", "single-session-user", "What is the name of my sister's cat?",
         "The information provided is not enough. You mentioned your cat but not your "
         "sister's.", _session("My cat is called Tofu.", "Cute name!")),
    ]
    rows = []
    for qid, qtype, question, answer, evidence in specs:
        rows.append({
            "question_id": qid,
            "question_type": qtype,
            "question": question,
            "answer": answer,
            "question_date": "2023/05/30 (Tue) 23:40",
            "haystack_session_ids": [f"sharegpt_{qid}_0", f"answer_{qid}_1"],
            "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/25 (Thu) 11:05"],
            "haystack_sessions": [small_talk, evidence],
            "answer_session_ids": [f"answer_{qid}_1"],
        })
    return rows


# -- LoCoMo: locomo10.json ------------------------------------------------------------------
def locomo_samples() -> list[dict[str, Any]]:
    conversation: dict[str, Any] = {
        "speaker_a": "Caroline",
        "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline", "dia_id": "D1:1",
             "text": "I went to a pottery class yesterday and made a blue bowl."},
            {"speaker": "Melanie", "dia_id": "D1:2", "text": "Lovely! " + filler("paint", 8),
             "img_url": ["https://example.invalid/sunset.jpg"],
             "blip_caption": "a photo of a painting of a sunset over a lake",
             "query": "painting sunset"},
        ],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [
            {"speaker": "Caroline", "dia_id": "D2:1",
             "text": "I have been researching adoption agencies and counseling courses."},
            {"speaker": "Melanie", "dia_id": "D2:2", "text": "My kids love camping and hiking."},
        ],
    }
    qa = [
        {"question": "What did Caroline research?",
         "answer": "Adoption agencies, counseling courses", "evidence": ["D2:1"], "category": 1},
        {"question": "When did Caroline go to a pottery class?", "answer": "7 May 2023",
         "evidence": ["D1:1"], "category": 2},
        {"question": "Would Caroline enjoy a ceramics fair?",
         "answer": "Likely yes; she took a pottery class", "evidence": ["D1:1"], "category": 3},
        {"question": "What do Melanie's kids love?", "answer": "camping and hiking",
         "evidence": ["D2:2"], "category": 4},
        {"question": "What colour bowl did Melanie make?", "evidence": ["D1:1"],
         "category": 5, "adversarial_answer": "blue"},
    ]
    return [{"sample_id": "conv-fixture", "conversation": conversation, "qa": qa,
             "event_summary": {}, "observation": {}, "session_summary": {}}]


# -- HotpotQA: hotpot_dev_distractor_v1.json ----------------------------------------------------
def hotpotqa_records() -> list[dict[str, Any]]:
    return [
        {
            "_id": "5a8b57f25542995d1e6f1371",
            "answer": "yes",
            "question": "Were Ada Lark and Ben Moss of the same nationality?",
            "supporting_facts": [["Ada Lark", 0], ["Ben Moss", 0]],
            "context": [
                ["Ada Lark", ["Ada Lark (born 1950) is an American director.",
                              " She lives in Ohio."]],
                ["Ben Moss", ["Ben Moss (1924-1978) was an American filmmaker."]],
                ["Lake Town", [filler("Lake Town", 40)]],
            ],
            "type": "comparison",
            "level": "hard",
        },
        {
            "_id": "5a8c7595554299585d9e36b6",
            "answer": "Chief of Protocol",
            "question": "What government position was held by the star of Kiss and Tell?",
            "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 1]],
            "context": [
                ["Kiss and Tell (1945 film)", ["Kiss and Tell is a 1945 film starring "
                                               "Shirley Temple."]],
                ["Shirley Temple", ["Shirley Temple was an actress.",
                                    " She served as Chief of Protocol of the United States."]],
            ],
            "type": "bridge",
            "level": "hard",
        },
    ]


# -- SWE-bench Verified: the test split as JSON lines -----------------------------------------
GOLD_PATCH = "\n".join([
    "diff --git a/src/pkg/util.py b/src/pkg/util.py",
    "--- a/src/pkg/util.py",
    "+++ b/src/pkg/util.py",
    "@@ -1,4 +1,4 @@",
    " def add(a, b):",
    "-    return a - b",
    "+    return a + b",
    " ",
    " ",
    "diff --git a/build/helpers.py b/build/helpers.py",
    "--- a/build/helpers.py",
    "+++ b/build/helpers.py",
    "@@ -10,3 +10,4 @@ def helper():",
    "     x = 1",
    "-    y = 2",
    "+    y = 3",
    "+    z = 4",
]) + "\n"
"""A two-file gold patch; the second path starts with "b" so a character-stripping
prefix removal ("b/build".lstrip("b/")) would get it wrong."""


def swe_verified_records() -> list[dict[str, Any]]:
    return [{
        "instance_id": "pkg__pkg-1234",
        "repo": "pkg/pkg",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "add() subtracts instead of adding.\n\n" + filler("add()", 30),
        "patch": GOLD_PATCH,
        "test_patch": "",
        "FAIL_TO_PASS": "[\"tests/test_util.py::test_add\"]",
        "PASS_TO_PASS": "[]",
        "version": "1.0",
    }]


# -- tau2-bench retail: domains/retail/{tasks.json, policy.md, db.json} ---------------------------
def tau2_retail_domain(folder: Path) -> Path:
    """Write a retail domain folder with two tasks (one without actions) and return it."""
    user = {
        "user_id": "yusuf_rossi_9620",
        "name": {"first_name": "Yusuf", "last_name": "Rossi"},
        "address": {"address1": "1 Main St", "address2": "", "city": "Philadelphia",
                    "country": "USA", "state": "PA", "zip": "19122"},
        "email": "yusuf.rossi@example.com",
        "payment_methods": {"credit_card_9513926": {"source": "credit_card",
                                                    "id": "credit_card_9513926"}},
        "orders": ["#W2378156"],
    }
    order = {"order_id": "#W2378156", "user_id": user["user_id"], "status": "delivered",
             "items": [{"name": "Keyboard", "product_id": "1656367028",
                        "item_id": "1151293680", "price": 10.0, "options": {}}]}
    product = {"name": "Keyboard", "product_id": "1656367028",
               "variants": {"1151293680": {"item_id": "1151293680", "options": {},
                                           "available": True, "price": 10.0}}}
    tasks = [
        {
            "id": "0",
            "description": {"purpose": None, "relevant_policies": None, "notes": None},
            "user_scenario": {"persona": None, "instructions": {
                "task_instructions": "Be brief.", "domain": "retail",
                "reason_for_call": "You want to exchange your keyboard in order #W2378156.",
                "known_info": "You are Yusuf Rossi in zip code 19122.",
                "unknown_info": "You do not remember your email address."}},
            "initial_state": None,
            "evaluation_criteria": {
                "actions": [
                    {"action_id": "0_0", "name": "find_user_id_by_name_zip",
                     "arguments": {"first_name": "Yusuf", "last_name": "Rossi",
                                   "zip": "19122"}, "info": None},
                    {"action_id": "0_1", "name": "get_order_details",
                     "arguments": {"order_id": "#W2378156"}, "info": None},
                ],
                "communicate_info": [], "nl_assertions": None, "reward_basis": ["DB"]},
        },
        {
            "id": "1",
            "description": {"purpose": None, "relevant_policies": None, "notes": None},
            "user_scenario": {"persona": None, "instructions": {
                "task_instructions": "", "domain": "retail",
                "reason_for_call": "You only want to chat.", "known_info": "",
                "unknown_info": ""}},
            "initial_state": None,
            "evaluation_criteria": {"actions": [], "communicate_info": [],
                                    "nl_assertions": None, "reward_basis": ["DB"]},
        },
    ]
    write_json(folder / "tasks.json", tasks)
    write_json(folder / "split_tasks.json", {"train": ["0"], "test": ["1"], "base": ["0", "1"]})
    write_json(folder / "db.json", {"users": {user["user_id"]: user},
                                    "orders": {order["order_id"]: order},
                                    "products": {product["product_id"]: product}})
    (folder / "policy.md").write_text("# Retail agent policy\n\n" + filler("policy", 40),
                                      encoding="utf-8")
    return folder


# -- needle: a directory of .txt essays ---------------------------------------------------------
def needle_haystack(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("b_essay.txt", "a_essay.txt"):
        (folder / name).write_text(filler(name, 20), encoding="utf-8")
    return folder


# -- jsonl: a team's own support chats (invented) ---------------------------------------------
SUPPORT_SYSTEM = "You are Acme's support assistant. Answer from the conversation."
SUPPORT_DEVICES = ("router", "laptop", "printer", "phone", "tablet", "camera")
SUPPORT_LABELS = ("Falcon", "Juniper", "Nimbus", "Orchid", "Pebble", "Quartz", "Rocket", "Sable")
SUPPORT_CATEGORIES = ("hardware", "account", "billing")
LOOKUP_TICKET = {"type": "function", "function": {
    "name": "lookup_ticket", "description": "A support ticket's status by its number.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                   "required": ["n"]}}}
SUPPORT_STEPS = (
    "Unplug it for thirty seconds, then plug it back in.",
    "Check that the firmware is the latest version in the settings page.",
    "Move it away from the microwave and other sources of interference.",
    "Reset the network settings and sign in again.",
    "Look at the status light: steady green means the connection is up.",
)


def _support_chat(index: int, turns: int) -> tuple[list[dict[str, Any]], str, str]:
    """A support conversation that names the user's device early, its question, answer."""
    device = SUPPORT_DEVICES[index % len(SUPPORT_DEVICES)]
    label = f"{SUPPORT_LABELS[(index * 7) % len(SUPPORT_LABELS)]}{index}"
    history: list[dict[str, Any]] = [
        {"role": "user", "content": f"Hi, my {device} is called {label} and it keeps "
                                    "dropping the connection."},
        {"role": "assistant", "content": "Sorry to hear that. Let us go through a few checks."},
    ]
    for turn in range(turns):
        step = SUPPORT_STEPS[(index + turn) % len(SUPPORT_STEPS)]
        tried = f"I tried that, it still drops. {filler(device, 3)}"
        history += [{"role": "user", "content": tried},
                    {"role": "assistant", "content": f"Next: {step} {filler('the checks', 2)}"}]
    return history, f"What is my {device} called? Reply with just the name.", label


def support_chat_records(count: int = 200, turns: int = 6) -> list[dict[str, Any]]:
    """``count`` records for the ``jsonl`` task: most in the ``messages`` form, every
    third as ``history`` + ``question``; categories cycle over three."""
    rows = []
    for index in range(count):
        history, question, label = _support_chat(index, turns)
        row: dict[str, Any] = {"id": f"chat-{index:04d}"}
        if index % 3 == 2:
            row.update(history=history, question=question)
        else:
            row["messages"] = [{"role": "system", "content": SUPPORT_SYSTEM}, *history,
                               {"role": "user", "content": question}]
        row.update(answer=label, category=SUPPORT_CATEGORIES[index % len(SUPPORT_CATEGORIES)])
        rows.append(row)
    return rows


def openai_chat_export(count: int = 4, turns: int = 3) -> tuple[list[dict[str, Any]],
                                                                 list[dict[str, Any]]]:
    """An OpenAI-style transcript export (chats with ``messages``, a tool call among them,
    and the ``tools`` the chat's model had) and a questions file about it, for
    ``budgetbench import-chats``."""
    chats: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    for index in range(count):
        history, question, label = _support_chat(index, turns)
        call = {"id": f"call_{index}", "type": "function",
                "function": {"name": "lookup_ticket", "arguments": json.dumps({"n": index})}}
        history[2:2] = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": f"ticket {index}: open"},
        ]
        chats.append({"id": f"conv-{index}", "title": f"Support chat {index}",
                      "messages": [{"role": "system", "content": SUPPORT_SYSTEM}, *history],
                      "tools": [LOOKUP_TICKET]})
        questions.append({"chat_id": f"conv-{index}", "question": question, "answer": label,
                          "category": SUPPORT_CATEGORIES[index % len(SUPPORT_CATEGORIES)]})
    return chats, questions
