"""`cqlm chat` through a pseudo-terminal (pexpect), driven by tests/bin/chat_cli.rs.

    python chat_pty.py CQLM ARCHIVE WORKDIR

Checks: two greedy turns whose second stats line reports as cached exactly
what the documented rule reuses (the first prompt plus its answer when the
second prompt extends them, else the first prompt but its last token, whose
state each turn keeps),
both computed here with jinja2 and the `tokenizers` package from the archive's
own chat template and tokenizer; `/tools demo` and "What is 23 * 40?" printing
a `calculate` call whose result holds 920; `/reset` (the next turn caches 0);
an unknown command and a bad tools file (one error line, the loop goes on);
`/save`; Ctrl-C at the prompt clearing the line; `/exit` with status 0. Prints `ok` at the end; any failure raises.
"""

import json
import re
import struct
import sys

import jinja2
import pexpect
from tokenizers import Tokenizer

CQLM, ARCHIVE, WORKDIR = sys.argv[1:4]
STATS = re.compile(r"\[prompt (\d+) tokens, (\d+) cached \| (\d+) generated")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))["__metadata__"]


META = metadata(ARCHIVE)
TOK = Tokenizer.from_str(META["cqlm.tokenizer"])
CFG = json.loads(META["cqlm.config"])
BOS, EOS = TOK.id_to_token(CFG["bos"]), TOK.id_to_token(CFG["eos"])
TEMPLATE = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(
    META["cqlm.chat_template"])


def prompt_ids(messages):
    """The ids of the prompt of `messages` (no tools), as a server would send it."""
    norm = [{"role": m["role"], "content": m.get("content") or "",
             "tool_calls": m.get("tool_calls") or []} for m in messages]
    text = TEMPLATE.render(messages=norm, tools=None, add_generation_prompt=True,
                           bos_token=BOS, eos_token=EOS)
    ids = TOK.encode(text, add_special_tokens=False).ids
    return ids if ids[:1] == [CFG["bos"]] else [CFG["bos"]] + ids


def extension(held, prompt):
    """len(held) when `prompt` extends `held` by at least one token, else 0."""
    return len(held) if len(prompt) > len(held) and prompt[:len(held)] == held else 0


def turn(child, line):
    """Send `line`; the stats line's (prompt, cached, generated) and what came before it."""
    child.sendline(line)
    child.expect(STATS)
    seen = ANSI.sub("", child.before)
    return tuple(int(g) for g in child.match.groups()), seen


def main():
    child = pexpect.spawn(CQLM, ["chat", "--backend", "cpu", "--temperature", "0",
                                 "--max-tokens", "48", "--ctx-tokens", "4096"],
                          cwd=WORKDIR, encoding="utf-8", timeout=120)
    child.expect("> ")
    # Two turns: the second continues the first's state.
    u1, u2 = "Hello!", "What can you do?"
    (p1, c1, g1), _ = turn(child, u1)
    assert c1 == 0, f"the first turn has nothing cached: {c1}"
    (p2, c2, g2), _ = turn(child, u2)
    child.expect("> ")
    save = f"{WORKDIR}/two_turns.json"
    child.sendline(f"/save {save}")
    child.expect(r"saved 4 messages")
    with open(save) as f:
        msgs = json.load(f)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"], msgs
    assert msgs[0]["content"] == u1 and msgs[2]["content"] == u2, msgs
    a1 = msgs[1]["content"]
    first = prompt_ids(msgs[:1])
    second = prompt_ids(msgs[:3])
    assert p1 == len(first), (p1, len(first))
    assert p2 == len(second), (p2, len(second))
    held = first + TOK.encode(a1, add_special_tokens=False).ids
    expected = max(extension(held, second), extension(first[:-1], second))
    assert expected > 0 and c2 == expected, f"cached {c2}, expected {expected}"
    assert g1 == len(held) - len(first), (g1, a1)
    print(f"turn 2: prompt {p2}, cached {c2} (expected {expected})")

    # An unknown command and a bad tools file: one error line each, the loop goes on.
    child.sendline("/frobnicate")
    child.expect(r"error: unknown command /frobnicate")
    child.sendline("/tools /nonexistent/tools.json")
    child.expect(r"error: cannot read the tools file /nonexistent/tools.json")

    # A demo tool call's round trip.
    child.sendline("/tools demo")
    child.expect(r"tools: demo")
    child.sendline("What is 23 * 40?")
    child.expect(r"→ calculate\((\{.*\})\)")
    args = json.loads(child.match.group(1))
    assert "23" in args["expression"] and "40" in args["expression"], args
    child.expect(r"← (\{.*\})")
    assert json.loads(child.match.group(1)).get("result") == 920, child.match.group(1)
    child.expect(STATS)
    child.expect("> ")

    # /reset: the next turn starts from nothing.
    child.sendline("/reset")
    child.expect(r"conversation cleared")
    (p3, c3, _), _ = turn(child, u1)
    assert c3 == 0 and p3 > 0, (p3, c3)
    child.expect("> ")
    child.sendline("/stats")
    child.expect(r"seed \d+")
    child.expect("> ")

    # Ctrl-C at the prompt clears the line: what follows runs alone.
    child.send("half a line")
    child.sendintr()
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.exitstatus
    print("ok")


main()
