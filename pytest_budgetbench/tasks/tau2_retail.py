"""``tau2_retail``: tau2-bench retail customer service, graded as a FIRST-ACTION PROXY.

This is NOT tau2-bench's metric. tau2-bench runs a full simulated conversation with tool
execution and checks the final database state; here the model answers once, naming the
agent's next tool call, and is graded only against the task's FIRST expected action in
``evaluation_criteria.actions``. It measures whether a memory strategy keeps the policy,
the scenario and the records the model needs to choose that call.

Reads tau2-bench's retail domain directory (``data/tau2/domains/retail`` in the tau2-bench
repository, holding ``tasks.json``, ``policy.md`` and ``db.json``) given by
``--budgetbench-data-tau2_retail``; a tau2 data root that contains
``domains/retail`` or ``tau2/domains/retail`` is accepted too.

History: the retail policy (several user messages of about ``chunk_tokens`` tokens), the
customer's scenario (the user simulator's instructions: reason for the call, what they
know and do not know), and the database records the task's actions touch (the customer's
user record and orders, the products involved), as JSON in several messages. The system
message lists the retail tools; the final user message asks for the next tool call as
one JSON object ``{"name": ..., "arguments": {...}}``. Tasks without an expected action
are skipped (the proxy is undefined for them).

Category: the name of the first expected action (e.g. ``find_user_id_by_name_zip``);
the train/test split and the number of actions are in ``Item.meta``.

Grader ``tau2-retail-first-action-proxy/2``: 1 iff the first JSON object in the reply
(``{"name": ..., "arguments": {...}}``; arguments given as a JSON string are decoded)
matches the task's first expected action as tau2's ``Action.compare_with_tool_call``
matches it: the same name, exactly; then, over the compared keys (the action's
``compare_args``, or, when it has none, the keys of the predicted call), the predicted and
expected arguments restricted to those keys are equal with Python's ``==`` (so "19122" is
not 19122, and case counts). As in tau2, an extra argument fails when the action has no
``compare_args``, and a missing argument passes then (the call is compared on the keys it
gives); with ``compare_args``, extra arguments are ignored and a missing compared key
fails. ``Grade.detail`` has the share of expected compared arguments that match.

Variant ``all-args`` (``--budgetbench-grader=tau2_retail:all-args``), stricter: tau2's
comparison, and also every expected argument (the ``compare_args``, else all) must be given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from pytest_budgetbench.messages import Message
from pytest_budgetbench.options import DataFile
from pytest_budgetbench.tasks._data import (
    malformed,
    missing,
    read_data_text,
    read_json,
    records,
    require,
)
from pytest_budgetbench.tasks._text import document_messages
from pytest_budgetbench.tasks.base import Grade, Item, Task

DOMAIN_FILES = ("tasks.json", "policy.md", "db.json")

TOOLS: dict[str, tuple[str, str]] = {
    "find_user_id_by_email": ("email", "Find a user id by email address."),
    "find_user_id_by_name_zip": ("first_name, last_name, zip",
                                 "Find a user id by first name, last name and zip code."),
    "get_user_details": ("user_id", "Get a user's profile, payment methods and orders."),
    "get_order_details": ("order_id", "Get an order's status, items and payments."),
    "get_product_details": ("product_id", "Get a product's variants (item ids, options)."),
    "get_item_details": ("item_id", "Get one item variant."),
    "list_all_product_types": ("", "List product names and product ids."),
    "calculate": ("expression", "Evaluate an arithmetic expression."),
    "cancel_pending_order": ("order_id, reason",
                             "Cancel a pending order; reason is 'no longer needed' or "
                             "'ordered by mistake'."),
    "modify_pending_order_address": ("order_id, address1, address2, city, state, country, "
                                     "zip", "Change a pending order's shipping address."),
    "modify_pending_order_items": ("order_id, item_ids, new_item_ids, payment_method_id",
                                   "Swap items of a pending order for other variants."),
    "modify_pending_order_payment": ("order_id, payment_method_id",
                                     "Change a pending order's payment method."),
    "modify_user_address": ("user_id, address1, address2, city, state, country, zip",
                            "Change a user's default address."),
    "return_delivered_order_items": ("order_id, item_ids, payment_method_id",
                                     "Return items of a delivered order for a refund."),
    "exchange_delivered_order_items": ("order_id, item_ids, new_item_ids, payment_method_id",
                                       "Exchange items of a delivered order for other "
                                       "variants of the same products."),
    "transfer_to_human_agents": ("summary", "Transfer the customer to a human agent."),
}

REQUEST = (
    "You are the retail agent in this conversation. Following the policy, what is your next "
    "tool call? Reply with one JSON object and nothing else, e.g. "
    '{"name": "get_order_details", "arguments": {"order_id": "#W0000000"}}'
)


def system_prompt(tools: dict[str, tuple[str, str]]) -> str:
    lines = [
        "You are a customer service agent for an online retail store. You act by calling "
        "one tool at a time. Tools (name(arguments): purpose):"
    ]
    lines += [f"- {name}({args}): {purpose}" for name, (args, purpose) in tools.items()]
    return "\n".join(lines)


def domain_dir(task: str, path: Path | None) -> Path:
    """The retail domain folder: ``path``, or ``path/domains/retail``, ``path/tau2/...``."""
    wanted = "tau2-bench's retail domain folder (tasks.json, policy.md, db.json)"
    if path is None:
        raise missing(task, wanted, "no path given")
    for candidate in (path, path / "retail", path / "domains" / "retail",
                      path / "tau2" / "domains" / "retail"):
        if all((candidate / name).is_file() for name in DOMAIN_FILES):
            return candidate
    problem = f"not found: {path}" if not path.exists() else f"no tasks.json, policy.md and " \
        f"db.json under {path}"
    raise missing(task, wanted, problem)


class Tau2RetailTask(Task):
    name = "tau2_retail"
    grader_version = "tau2-retail-first-action-proxy/2"
    grader_variants: ClassVar[dict[str, str]] = {
        "all-args": "tau2's comparison, and a missing expected argument fails too",
    }
    data = DataFile("the tau2 retail domain directory")

    def load(self) -> list[Item]:
        folder = domain_dir(self.name, self.options.data_path)
        tasks = records(self.name, folder / "tasks.json",
                        read_json(self.name, folder / "tasks.json", "tasks.json"), "tasks.json")
        db = read_json(self.name, folder / "db.json", "db.json")
        if not isinstance(db, dict) or not {"users", "orders", "products"} <= set(db):
            raise malformed(self.name, folder / "db.json", "expected an object with users, "
                            "orders and products", "db.json")
        policy = read_data_text(self.name, folder / "policy.md", "policy.md")
        splits = self._splits(folder)
        tools = dict(TOOLS)
        for task in tasks:
            for action in _actions(task):
                tools.setdefault(str(action.get("name")),
                                 (", ".join(action.get("arguments") or {}), "(see the policy)"))
        system = system_prompt(tools)
        items = []
        for index, task in enumerate(tasks):
            item = self._item(folder, index, task, db, policy, system, splits)
            if item is not None:
                items.append(item)
        return items

    def _splits(self, folder: Path) -> dict[str, str]:
        path = folder / "split_tasks.json"
        if not path.is_file():
            return {}
        try:  # a byte that is not UTF-8 is one line naming it, as in every data file
            data = json.loads(read_data_text(self.name, path, "split_tasks.json"))
        except json.JSONDecodeError:
            return {}
        return {str(i): name for name in ("train", "test") for i in data.get(name, [])}

    def _item(
        self,
        folder: Path,
        index: int,
        task: dict[str, Any],
        db: dict[str, Any],
        policy: str,
        system: str,
        splits: dict[str, str],
    ) -> Item | None:
        path = folder / "tasks.json"
        require(self.name, path, task, index, ("id", "user_scenario", "evaluation_criteria"),
                key="id")
        actions = list(_actions(task))
        if not actions:
            return None
        first = actions[0]
        if not isinstance(first, dict) or "name" not in first:
            raise malformed(self.name, path, f"task {task['id']!r} has an action without name")
        chunk = self.options.chunk_tokens
        messages: list[Message] = [{"role": "system", "content": system}]
        messages += document_messages(policy, chunk, header="[Retail policy]", numbered=True)
        messages.append({"role": "user", "content": _scenario_text(task)})
        records_text = json.dumps(_relevant_records(db, actions), indent=1, ensure_ascii=False)
        messages += document_messages(records_text, chunk, numbered=True,
                                      header="[Database records relevant to this customer]")
        messages.append({"role": "user", "content": REQUEST})
        return Item(
            item_id=str(task["id"]),
            messages=tuple(messages),
            answer={"name": first["name"], "arguments": first.get("arguments") or {},
                    "compare_args": first.get("compare_args")},
            category=str(first["name"]),
            meta={"split": splits.get(str(task["id"])), "actions": len(actions)},
        )

    def grade(self, item: Item, prediction: str) -> Grade:
        call = first_json_object(prediction)
        if call is None or not isinstance(call.get("name"), str):
            return Grade(0.0, "", self.grader_id, {"reason": "no JSON tool call"})
        extracted = json.dumps(call, sort_keys=True, ensure_ascii=False)
        expected = item.answer
        given = call.get("arguments")
        if isinstance(given, str):
            # The OpenAI tool-call form carries arguments as a JSON string.
            given = first_json_object(given)
        given = given if isinstance(given, dict) else {}
        matched = tau2_match(expected, call["name"], given)
        wanted = expected_keys(expected)
        if self.grader_variant == "all-args":
            matched = matched and all(key in given for key in wanted)
        same = [k for k in wanted if k in given and given[k] == expected["arguments"].get(k)]
        share = len(same) / len(wanted) if wanted else 1.0
        return Grade(float(matched), extracted, self.grader_id,
                     {"name_ok": call["name"] == expected["name"], "argument_match": share,
                      "expected": expected["name"]})


def expected_keys(expected: dict[str, Any]) -> list[str]:
    """The arguments an action checks: its ``compare_args``, else all of its arguments."""
    keys = expected.get("compare_args")
    return list(expected["arguments"]) if keys is None else list(keys)


def tau2_match(expected: dict[str, Any], name: str, arguments: dict[str, Any]) -> bool:
    """tau2's ``Action.compare_with_tool_call`` on a predicted (name, arguments)."""
    if name != expected["name"]:
        return False
    keys = expected.get("compare_args")
    compared = list(arguments) if keys is None else list(keys)
    if not compared:
        return True
    given = {k: v for k, v in arguments.items() if k in compared}
    wanted = {k: v for k, v in expected["arguments"].items() if k in compared}
    return given == wanted


# -- helpers ------------------------------------------------------------------------------
def _actions(task: dict[str, Any]) -> Iterator[dict[str, Any]]:
    criteria = task.get("evaluation_criteria") or {}
    for action in criteria.get("actions") or []:
        if isinstance(action, dict):
            yield action


def _scenario_text(task: dict[str, Any]) -> str:
    scenario = task.get("user_scenario") or {}
    instructions = scenario.get("instructions") or {}
    if isinstance(instructions, str):
        body = instructions
    else:
        parts = [("Reason for the call", instructions.get("reason_for_call")),
                 ("What the customer knows", instructions.get("known_info")),
                 ("What the customer does not know", instructions.get("unknown_info")),
                 ("How the customer behaves", instructions.get("task_instructions"))]
        body = "\n".join(f"{label}: {text}" for label, text in parts if text)
    persona = scenario.get("persona")
    if persona:
        body = f"Persona: {persona}\n{body}"
    return f"[The customer's situation, as given to the customer]\n{body}"


def _relevant_records(db: dict[str, Any], actions: list[dict[str, Any]]) -> dict[str, Any]:
    """The users, orders and products the expected actions refer to."""
    users, orders, products = db["users"], db["orders"], db["products"]
    args = [a.get("arguments") or {} for a in actions]
    user_ids = {a["user_id"] for a in args if "user_id" in a}
    for a in args:
        user_ids |= {uid for uid, user in users.items() if _user_matches(user, a)}
    order_ids = {a["order_id"] for a in args if "order_id" in a}
    for uid in user_ids:
        order_ids |= set(users.get(uid, {}).get("orders", []))
    item_ids = {str(i) for a in args for key in ("item_ids", "new_item_ids")
                for i in a.get(key, [])} | {str(a["item_id"]) for a in args if "item_id" in a}
    product_ids = {str(a["product_id"]) for a in args if "product_id" in a}
    product_ids |= {pid for pid, product in products.items()
                    if item_ids & set(product.get("variants", {}))}
    return {
        "users": {uid: users[uid] for uid in sorted(user_ids) if uid in users},
        "orders": {oid: orders[oid] for oid in sorted(order_ids) if oid in orders},
        "products": {pid: products[pid] for pid in sorted(product_ids) if pid in products},
    }


def _user_matches(user: dict[str, Any], arguments: dict[str, Any]) -> bool:
    if "email" in arguments:
        return str(user.get("email", "")).lower() == str(arguments["email"]).lower()
    if {"first_name", "last_name", "zip"} <= set(arguments):
        name = user.get("name", {})
        return (
            same_value(name.get("first_name"), arguments["first_name"])
            and same_value(name.get("last_name"), arguments["last_name"])
            and same_value(user.get("address", {}).get("zip"), arguments["zip"])
        )
    return False


def same_value(given: Any, expected: Any) -> bool:
    """Argument equality: strings stripped and case-folded, numbers by value, lists in order."""
    if isinstance(expected, list):
        return (isinstance(given, list) and len(given) == len(expected)
                and all(same_value(g, e) for g, e in zip(given, expected, strict=True)))
    if isinstance(expected, dict):
        return (isinstance(given, dict) and given.keys() == expected.keys()
                and all(same_value(given[k], expected[k]) for k in expected))
    if isinstance(expected, bool) or isinstance(given, bool):
        return given is expected
    if isinstance(expected, int | float) or isinstance(given, int | float):
        try:
            return float(given) == float(expected)
        except (TypeError, ValueError):
            return False
    if given is None or expected is None:
        return given is expected
    return str(given).strip().casefold() == str(expected).strip().casefold()


def first_json_object(reply: str | None) -> dict[str, Any] | None:
    """The first JSON object in a reply (fenced or inline), or None."""
    text = (reply or "").replace("```json", "```")
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None
