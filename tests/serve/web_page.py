"""The web page of `cqlm serve` in a real headless Chromium (selenium).

Usage: web_page.py BASE_URL SCREENSHOT_DIR

Run by tests/bin/web_page.rs against a live server on the built-in model. Loads
`/`, streams an answer (sampled while it grows), stops one, runs a demo tool call
through the server, reloads and finds the conversation in the sidebar, opens the
Kernels view (one bar per row of GET /v1/cqlm/profile), switches to dark, and
renders at phone width. Any SEVERE browser console message fails. Prints the page
load time (a figure for BENCHMARKS.md, not asserted); writes a screenshot of each
state to SCREENSHOT_DIR. Exits non-zero (an assertion) on any failure.
"""

import json
import os
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

BASE, SHOTS = sys.argv[1].rstrip("/"), sys.argv[2]
os.makedirs(SHOTS, exist_ok=True)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CQLM_CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1200,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CQLM_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(options=opts, service=service)


driver = browser()
wait = WebDriverWait(driver, 30, poll_frequency=0.02)
errors = []


def check_console(where):
    for entry in driver.get_log("browser"):
        if entry["level"] == "SEVERE":
            errors.append(f"{where}: {entry['message']}")
    assert not errors, "browser console errors:\n" + "\n".join(errors)


def shot(name):
    path = os.path.join(SHOTS, name + ".png")
    driver.save_screenshot(path)
    print(f"screenshot {path}")


def by_id(i):
    return driver.find_element(By.ID, i)


def answers():
    return driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")


def settings(**kw):
    """Open the panel, set fields by id, close it."""
    if not by_id("settings").is_displayed():
        by_id("settings-toggle").click()
    for i, v in kw.items():
        e = by_id(i)
        if isinstance(v, bool):
            if e.is_selected() != v:
                e.click()
        else:
            e.clear()
            e.send_keys(str(v))
            driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", e)
    by_id("settings-toggle").click()


def send(text):
    box = by_id("input")
    box.clear()
    box.send_keys(text)
    by_id("send").click()


def idle():
    wait.until(lambda d: by_id("send").is_displayed() and not by_id("stop").is_displayed())


# 1. Load, timed.
driver.get(BASE + "/")
wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
time.sleep(0.1)
load_ms = driver.execute_script(
    "const n = performance.getEntriesByType('navigation')[0];"
    "return n.loadEventEnd - n.startTime;")
print(f"page load {load_ms:.1f} ms")
# A figure to report (BENCHMARKS.md), not a timed assertion: it only has to exist.
assert load_ms > 0, f"page load {load_ms} ms"
assert driver.title == "cqlm"
check_console("load")
shot("1-empty")

# 2. A streamed answer grows over several updates (the server runs with
# CQLM_SERVE_PASS_DELAY_MS, so that the tiny model's short answer streams over
# a second or so; the page re-renders the answer as each piece arrives).
settings(temperature=0, **{"max-tokens": 60})

send("Who was Noah?")
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant.streaming"))
lengths = []
while by_id("stop").is_displayed():
    streaming = driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant.streaming .content")
    if streaming:
        try:
            lengths.append(len(streaming[0].text))
        except Exception:  # re-rendered under us
            pass
    time.sleep(0.03)

idle()
distinct = sorted(set(lengths))
print(f"answer lengths while streaming: {distinct}")
assert lengths == sorted(lengths), f"the answer shrank while streaming: {lengths}"
assert len([n for n in distinct if n > 0]) >= 3, f"fewer than 3 distinct lengths: {distinct}"
final = answers()[-1]
assert final.find_element(By.CSS_SELECTOR, ".content").text.strip(), "empty answer"
stats = final.find_element(By.CSS_SELECTOR, ".stats").text
print(f"answer figures: {stats}")
assert "first token" in stats and "tok/s" in stats and "cached" in stats, stats
check_console("stream")
shot("2-streamed")

# 3. Stop a generation mid-stream; the server keeps serving the next message.

send("Tell me a story about a king.")
wait.until(lambda d: any(n.text for n in d.find_elements(
    By.CSS_SELECTOR, "#messages .msg.assistant.streaming .content")))
by_id("stop").click()
idle()

stopped = answers()[-1]
assert "stopped" in stopped.find_element(By.CSS_SELECTOR, ".stats").get_attribute("class")
n_stopped = len(stopped.find_element(By.CSS_SELECTOR, ".content").text)
time.sleep(0.5)
assert len(answers()[-1].find_element(By.CSS_SELECTOR, ".content").text) == n_stopped
before = len(answers())
send("Who was Noah?")
idle()
assert len(answers()) == before + 1, "no answer after the stop"
assert answers()[-1].find_element(By.CSS_SELECTOR, ".content").text.strip()
check_console("stop")
shot("3-stopped-then-answered")

# 4. A demo tool call, run on the server: the card and the model's answer.
by_id("new-chat").click()
settings(**{"tools-on": True, "tools-server": True, "temperature": 0, "max-tokens": 120})
send("What is 23 * 40?")
idle()
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tool-card .tool-result"))
card = driver.find_element(By.CSS_SELECTOR, ".tool-card")
assert card.find_element(By.CSS_SELECTOR, ".tool-name").text == "calculate", card.text
assert "920" in card.find_element(By.CSS_SELECTOR, ".tool-result").text, card.text
last = answers()[-1].find_element(By.CSS_SELECTOR, ".content").text
print(f"tool answer: {last!r}")
assert "920" in last, f"the answer after the tool does not say 920: {last!r}"
check_console("tool")
shot("4-tool-call")

# 4b. The same with "run demo tools on the server" off: the card asks for the
# result, the user types it, and the conversation goes on to the answer.
by_id("new-chat").click()
settings(**{"tools-server": False})
send("What is 23 * 40?")
idle()
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tool-card .tool-input textarea"))
card = driver.find_element(By.CSS_SELECTOR, ".tool-card")
assert card.find_element(By.CSS_SELECTOR, ".tool-name").text == "calculate", card.text
shot("4b-tool-asks")
card.find_element(By.CSS_SELECTOR, ".tool-input textarea").send_keys('{"result":920}')
card.find_element(By.CSS_SELECTOR, ".tool-submit").click()
wait.until(lambda d: len(answers()) == 2 and by_id("send").is_displayed())
assert "920" in driver.find_element(By.CSS_SELECTOR, ".tool-card .tool-result").text
last = answers()[-1].find_element(By.CSS_SELECTOR, ".content").text
print(f"tool answer (typed result): {last!r}")
assert "920" in last, last
check_console("typed tool result")
shot("4c-tool-typed")

# 5. Reload: the conversations are in the sidebar, the tool one opens.
driver.refresh()
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#conv-list li"))
titles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#conv-list .conv-open")]
print(f"sidebar after reload: {titles}")
assert any("23 * 40" in t for t in titles), titles
assert any("Who was Noah" in t for t in titles), titles
assert driver.find_elements(By.CSS_SELECTOR, ".tool-card .tool-name")
check_console("reload")
shot("5-reloaded")

# 5b. Markdown is rendered with DOM nodes only: a stored answer with HTML and a
# javascript: link shows them as text; bold, code, lists, headings and http(s)
# links render.
HOSTILE = ("# Title\n\nSome **bold** and *it* and `code <b>x</b>`.\n\n"
           "<img src=x onerror=\"window.__pwned=1\"><b>raw</b>\n\n"
           "- one\n- [ok](https://example.com/a)\n\n1. [bad](javascript:window.__pwned=1)\n\n"
           "```\n<script>window.__pwned=1</script>\n```")
driver.execute_script("""
  const convs = JSON.parse(localStorage.getItem('cqlm.convs'));
  convs.unshift({id: 'md', title: 'markdown', updated: Date.now(), messages: [
    {role: 'user', content: '<i>hi</i>'}, {role: 'assistant', content: arguments[0]}]});
  localStorage.setItem('cqlm.convs', JSON.stringify(convs));
  localStorage.setItem('cqlm.current', JSON.stringify('md'));""", HOSTILE)
driver.refresh()
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant"))
md = answers()[-1].find_element(By.CSS_SELECTOR, ".content")
count = lambda sel: len(md.find_elements(By.CSS_SELECTOR, sel))
assert count("h1") == 1 and count("strong") == 1 and count("em") == 1, md.get_attribute("outerHTML")
assert count("code") == 2 and count("pre") == 1 and count("ul li") == 2 and count("ol li") == 1
assert count("img") == 0 and count("b") == 0 and count("script") == 0, md.get_attribute("outerHTML")
links = md.find_elements(By.CSS_SELECTOR, "a")
assert [a.get_attribute("href") for a in links] == ["https://example.com/a"], links
assert "noopener" in links[0].get_attribute("rel")
assert "<b>raw</b>" in md.text and "<script>" in md.text and "javascript:" in md.text
assert driver.find_element(By.CSS_SELECTOR, "#messages .msg.user .content").text == "<i>hi</i>"
assert driver.execute_script("return window.__pwned") is None
check_console("markdown")
shot("5b-markdown")

# 6. Kernels: one bar per row of the profile route (fetched independently).
with urllib.request.urlopen(BASE + "/v1/cqlm/profile") as r:
    profile = json.load(r)
kernels = {row["kernel"] for row in profile["rows"]}
by_id("view-kernels").click()
by_id("kernels-refresh").click()
wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#kernel-chart .bar-row"))
bars = driver.find_elements(By.CSS_SELECTOR, "#kernel-chart .bar-row")
names = {b.get_attribute("data-kernel") for b in bars}
print(f"kernel bars: {len(bars)} ({sorted(names)})")
assert len(bars) == len(profile["rows"]) and names == kernels, (names, kernels)
widths = [b.find_element(By.CSS_SELECTOR, ".bar").size["width"] for b in bars]
assert widths[0] > 0 and widths == sorted(widths, reverse=True), widths
check_console("kernels")
shot("6-kernels")

# 7. Dark theme: the computed background changes.
bg = lambda: driver.execute_script("return getComputedStyle(document.body).backgroundColor")
light = bg()
by_id("theme-toggle").click()
dark = bg()
print(f"background {light} -> {dark}")
assert light != dark, "the theme toggle changed nothing"
shot("7-kernels-dark")
by_id("view-chat").click()
shot("8-chat-dark")

# 8. Phone width: the sidebar collapses behind the menu button.
driver.set_window_size(375, 800)
time.sleep(0.3)
sidebar = by_id("sidebar")
assert sidebar.location["x"] + sidebar.size["width"] <= 1, "the sidebar is not collapsed"
assert by_id("menu").is_displayed()
shot("9-phone")
by_id("menu").click()
time.sleep(0.4)
assert sidebar.location["x"] >= -1, "the menu does not open the sidebar"
shot("10-phone-sidebar")
check_console("phone")

driver.quit()
print("web page: ok")
