"""Write records.jsonl, negatives.jsonl (and tools.json) for the dev_tools example family.

The catalog, tools.mcp.json, is a subset of the tools/list result of GitHub's official MCP server
(github/github-mcp-server, MIT licence, tag v0.17.0): twelve tools for issues, pull requests, GitHub Actions
runs and releases, with the server's tool names, parameter names, types and required lists; descriptions are
our own. Parameters dropped to keep it small: pagination (page, perPage, after), sort orders, list-valued
ones (labels, assignees: a task graph's argument values are strings) and a few rarely used ones (draft,
maintainer_can_modify, milestone, type, head, event, commit_message).

Every request below was written by hand, in the styles developers actually type: terse commands, polite
asks, questions, chat shorthand, slack-style dumps, long preambles, typos in the words around the values. The
script turns the short node notation into the record format and checks what a hand could get wrong:

* every literal argument value appears verbatim in its request (plans copy values from the request);
* every argument is declared by the catalog, required ones are present, enum values are among the enum's,
  number-typed values are digits;
* no skill appears twice in a plan (the decoder forbids it);
* a "<node-j>" value names an earlier node.

It also writes negatives.jsonl: requests the family must refuse (graph null), each with its kind.

    .venv/bin/python examples/dev_tools/make_records.py      # rewrites records.jsonl, negatives.jsonl, tools.json
"""
from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILY = "dev_tools"
NODE_REF = re.compile(r"^<node-(\d+)>$")

# (request, [(skill, {argument: value})], extra links as (source node, target node))
# "<node-j>" is the output of node j; it implies the link j -> this node, so only ordering without data
# flow needs an explicit link. owner and repo are separate values: "acme/api" holds both verbatim.
ENTRIES: list[tuple[str, list[tuple[str, dict]], list[tuple[int, int]]]] = [
    # -- one step -------------------------------------------------------------------------------
    # list_issues: its state enum is upper case (OPEN / CLOSED), so only requests that type it that way
    # (filter syntax) set it; "open issues" in plain words would need a value the request does not hold.
    ("list issues in acme/payments-service", [("list_issues", {"owner": "acme", "repo": "payments-service"})], []),
    ("show me issues for octo-org/web-app, state=CLOSED, since 2025-05-01",
     [("list_issues", {"owner": "octo-org", "repo": "web-app", "state": "CLOSED", "since": "2025-05-01"})], []),
    ("Could you pull up the issue tracker for grafana/loki? Filter it to state:OPEN please.",
     [("list_issues", {"owner": "grafana", "repo": "loki", "state": "OPEN"})], []),
    ("wats been happening in the kestrel-labs/ingest issues? anything updated since 2025-06-15",
     [("list_issues", {"owner": "kestrel-labs", "repo": "ingest", "since": "2025-06-15"})], []),
    ("get issue 1287 in acme/api", [("get_issue", {"owner": "acme", "repo": "api", "issue_number": "1287"})], []),
    ("Can you open up issue #56 on nimbus-io/cli and tell me what it's about?",
     [("get_issue", {"owner": "nimbus-io", "repo": "cli", "issue_number": "56"})], []),
    ("Could you fetch the details of issue number 9 in the repo jlee/dotfiles, please?",
     [("get_issue", {"owner": "jlee", "repo": "dotfiles", "issue_number": "9"})], []),
    ('create an issue in acme/api titled "Rate limiter returns 500 instead of 429"',
     [("create_issue", {"owner": "acme", "repo": "api", "title": "Rate limiter returns 500 instead of 429"})], []),
    ("file a bug on octo-org/web-app: title 'Dark mode toggle resets on refresh', body 'Repro: enable dark mode, "
     "hit F5, it flips back to light. Chrome 126 on macOS.'",
     [("create_issue", {"owner": "octo-org", "repo": "web-app", "title": "Dark mode toggle resets on refresh",
                        "body": "Repro: enable dark mode, hit F5, it flips back to light. Chrome 126 on macOS."})], []),
    ("I just noticed our docs link is dead. Could you open an issue in nimbus-io/docs with the title \"Broken link "
     "to install guide in README\" and in the body say \"The install guide link points to /docs/install, which "
     "404s since the site move.\"? Thanks a lot!",
     [("create_issue", {"owner": "nimbus-io", "repo": "docs", "title": "Broken link to install guide in README",
                        "body": "The install guide link points to /docs/install, which 404s since the site move."})],
     []),
    # add_issue_comment also comments on a pull request: GitHub numbers PRs and issues together.
    ("comment 'LGTM, shipping after CI' on PR 311 in acme/payments-service",
     [("add_issue_comment", {"owner": "acme", "repo": "payments-service", "issue_number": "311",
                             "body": "LGTM, shipping after CI"})], []),
    ("add a comment to kestrel-labs/ingest issue 17 saying can reproduce on arm64 too",
     [("add_issue_comment", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "17",
                             "body": "can reproduce on arm64 too"})], []),
    ("drop a note on issue 2045 in grafana/loki -> Closing as duplicate of #1990",
     [("add_issue_comment", {"owner": "grafana", "repo": "loki", "issue_number": "2045",
                             "body": "Closing as duplicate of #1990"})], []),
    ("list open PRs in acme/api", [("list_pull_requests", {"owner": "acme", "repo": "api", "state": "open"})], []),
    ("Which pull requests target release/2.3 in octo-org/web-app?",
     [("list_pull_requests", {"owner": "octo-org", "repo": "web-app", "base": "release/2.3"})], []),
    ("all prs for nimbus-io/cli, open and closed",
     [("list_pull_requests", {"owner": "nimbus-io", "repo": "cli", "state": "all"})], []),
    ("show closed pull requests against main in kestrel-labs/ingest",
     [("list_pull_requests", {"owner": "kestrel-labs", "repo": "ingest", "state": "closed", "base": "main"})], []),
    ("get PR 42 in acme/api", [("get_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "42"})], []),
    ("Can you look at pull request #1203 on pydata/xarray and tell me if it's mergable?",
     [("get_pull_request", {"owner": "pydata", "repo": "xarray", "pullNumber": "1203"})], []),
    ("status of PR acme/payments-service#77?",
     [("get_pull_request", {"owner": "acme", "repo": "payments-service", "pullNumber": "77"})], []),
    ('open a PR in acme/api from feature/rate-limit to main titled "Add token bucket rate limiter"',
     [("create_pull_request", {"owner": "acme", "repo": "api", "head": "feature/rate-limit", "base": "main",
                               "title": "Add token bucket rate limiter"})], []),
    ("Could you please create a pull request on octo-org/web-app merging fix/dark-mode-persist into develop? "
     "Title: Persist dark mode preference. Description: Stores the theme in localStorage and reads it on load.",
     [("create_pull_request", {"owner": "octo-org", "repo": "web-app", "head": "fix/dark-mode-persist",
                               "base": "develop", "title": "Persist dark mode preference",
                               "body": "Stores the theme in localStorage and reads it on load."})], []),
    ("pr kestrel-labs/ingest: head chore/bump-protobuf base main title 'Bump protobuf to 5.27'",
     [("create_pull_request", {"owner": "kestrel-labs", "repo": "ingest", "head": "chore/bump-protobuf",
                               "base": "main", "title": "Bump protobuf to 5.27"})], []),
    ("merge PR 42 in acme/api", [("merge_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "42"})], []),
    ("squash #311 in acme/payments-service",
     [("merge_pull_request", {"owner": "acme", "repo": "payments-service", "pullNumber": "311",
                              "merge_method": "squash"})], []),
    ('merge octo-org/web-app PR 958 with a merge commit titled "Release 2.4.0 (#958)"',
     [("merge_pull_request", {"owner": "octo-org", "repo": "web-app", "pullNumber": "958", "merge_method": "merge",
                              "commit_title": "Release 2.4.0 (#958)"})], []),
    ("list runs of ci.yml in acme/api", [("list_workflow_runs", {"owner": "acme", "repo": "api",
                                                                 "workflow_id": "ci.yml"})], []),
    ("show me the release.yml workflow runs on branch main for octo-org/web-app",
     [("list_workflow_runs", {"owner": "octo-org", "repo": "web-app", "workflow_id": "release.yml",
                              "branch": "main"})], []),
    ("any deploy.yml runs queued rn in kestrel-labs/ingest?",
     [("list_workflow_runs", {"owner": "kestrel-labs", "repo": "ingest", "workflow_id": "deploy.yml",
                              "status": "queued"})], []),
    ("build.yml runs in_progress on acme/payments-service",
     [("list_workflow_runs", {"owner": "acme", "repo": "payments-service", "workflow_id": "build.yml",
                              "status": "in_progress"})], []),
    ("rerun workflow run 9876543210 in acme/api",
     [("rerun_workflow_run", {"owner": "acme", "repo": "api", "run_id": "9876543210"})], []),
    ("Can you re-run Actions run 11223344556 on octo-org/web-app? Looks like a flaky test to me.",
     [("rerun_workflow_run", {"owner": "octo-org", "repo": "web-app", "run_id": "11223344556"})], []),
    ("kick run 10498822371 in kestrel-labs/ingest again pls",
     [("rerun_workflow_run", {"owner": "kestrel-labs", "repo": "ingest", "run_id": "10498822371"})], []),
    ("latest release of grafana/loki?", [("get_latest_release", {"owner": "grafana", "repo": "loki"})], []),
    ("What's the newest release of acme/api", [("get_latest_release", {"owner": "acme", "repo": "api"})], []),
    ("Morning! Our changelog bot is down, so could you check which version nimbus-io/cli last shipped? I need "
     "the latest release notes for the standup.",
     [("get_latest_release", {"owner": "nimbus-io", "repo": "cli"})], []),
    ("get release v2.4.0 of octo-org/web-app",
     [("get_release_by_tag", {"owner": "octo-org", "repo": "web-app", "tag": "v2.4.0"})], []),
    ("show the notes for the v1.0.0-rc.2 release in kestrel-labs/ingest",
     [("get_release_by_tag", {"owner": "kestrel-labs", "repo": "ingest", "tag": "v1.0.0-rc.2"})], []),
    ("what was in pydata/xarray v2024.06.0?",
     [("get_release_by_tag", {"owner": "pydata", "repo": "xarray", "tag": "v2024.06.0"})], []),
    # -- chains ---------------------------------------------------------------------------------
    ("rerun the latest ci.yml run on main in acme/api",
     [("list_workflow_runs", {"owner": "acme", "repo": "api", "workflow_id": "ci.yml", "branch": "main"}),
      ("rerun_workflow_run", {"owner": "acme", "repo": "api", "run_id": "<node-0>"})], []),
    ("check PR 42 in acme/api and if it looks ok merge it",
     [("get_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "42"}),
      ("merge_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "42"})], [(0, 1)]),
    ('open an issue in octo-org/web-app titled "Flaky checkout test" and comment "Seen 3 times this week on main" '
     'on it',
     [("create_issue", {"owner": "octo-org", "repo": "web-app", "title": "Flaky checkout test"}),
      ("add_issue_comment", {"owner": "octo-org", "repo": "web-app", "issue_number": "<node-0>",
                             "body": "Seen 3 times this week on main"})], []),
    ('Open a PR from release/2.4 to main in octo-org/web-app titled "Release 2.4", then squash merge it.',
     [("create_pull_request", {"owner": "octo-org", "repo": "web-app", "head": "release/2.4", "base": "main",
                               "title": "Release 2.4"}),
      ("merge_pull_request", {"owner": "octo-org", "repo": "web-app", "pullNumber": "<node-0>",
                              "merge_method": "squash"})], []),
    ("get the latest release of grafana/loki and post its notes as a comment on issue 3312 in acme/observability",
     [("get_latest_release", {"owner": "grafana", "repo": "loki"}),
      ("add_issue_comment", {"owner": "acme", "repo": "observability", "issue_number": "3312",
                             "body": "<node-0>"})], []),
    ("list open PRs in kestrel-labs/ingest and drop teh list as a comment on issue 40",
     [("list_pull_requests", {"owner": "kestrel-labs", "repo": "ingest", "state": "open"}),
      ("add_issue_comment", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "40", "body": "<node-0>"})],
     []),
    ("find the most recnet deploy.yml run in acme/payments-service and re-run it",
     [("list_workflow_runs", {"owner": "acme", "repo": "payments-service", "workflow_id": "deploy.yml"}),
      ("rerun_workflow_run", {"owner": "acme", "repo": "payments-service", "run_id": "<node-0>"})], []),
    ("Read issue 88 in octo-org/web-app and open a PR from fix/issue-88 into main titled \"Fix avatar upload "
     "crash\", using the issue as the description.",
     [("get_issue", {"owner": "octo-org", "repo": "web-app", "issue_number": "88"}),
      ("create_pull_request", {"owner": "octo-org", "repo": "web-app", "head": "fix/issue-88", "base": "main",
                               "title": "Fix avatar upload crash", "body": "<node-0>"})], []),
    ("merge PR 311 in acme/api then comment 'merged, deploying now' on issue 305",
     [("merge_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "311"}),
      ("add_issue_comment", {"owner": "acme", "repo": "api", "issue_number": "305",
                             "body": "merged, deploying now"})], [(0, 1)]),
    ('grab release v3.1.0 of nimbus-io/cli and open an issue in nimbus-io/docs titled "Document v3.1.0 changes" '
     'with the release notes as the body',
     [("get_release_by_tag", {"owner": "nimbus-io", "repo": "cli", "tag": "v3.1.0"}),
      ("create_issue", {"owner": "nimbus-io", "repo": "docs", "title": "Document v3.1.0 changes",
                        "body": "<node-0>"})], []),
    ("list ci.yml runs for branch feature/search in octo-org/web-app and paste them into PR 977 as a comment",
     [("list_workflow_runs", {"owner": "octo-org", "repo": "web-app", "workflow_id": "ci.yml",
                              "branch": "feature/search"}),
      ("add_issue_comment", {"owner": "octo-org", "repo": "web-app", "issue_number": "977", "body": "<node-0>"})],
     []),
    ("what's the latest release of acme/api? open an issue in acme/helm-charts titled 'Bump api chart to latest "
     "release' and put the release info in the body",
     [("get_latest_release", {"owner": "acme", "repo": "api"}),
      ("create_issue", {"owner": "acme", "repo": "helm-charts", "title": "Bump api chart to latest release",
                        "body": "<node-0>"})], []),
    ("look at issue #17 in kestrel-labs/ingest first, then reply 'on it, PR incoming'",
     [("get_issue", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "17"}),
      ("add_issue_comment", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "17",
                             "body": "on it, PR incoming"})], [(0, 1)]),
    ("rebase merge pr 58 on jlee/dotfiles, after that tell me what the latest release is",
     [("merge_pull_request", {"owner": "jlee", "repo": "dotfiles", "pullNumber": "58", "merge_method": "rebase"}),
      ("get_latest_release", {"owner": "jlee", "repo": "dotfiles"})], [(0, 1)]),
    ('list issues in acme/api since 2025-07-01 and file a summary issue titled "July triage" with that list',
     [("list_issues", {"owner": "acme", "repo": "api", "since": "2025-07-01"}),
      ("create_issue", {"owner": "acme", "repo": "api", "title": "July triage", "body": "<node-0>"})], []),
    ("Get pull request 1203 from pydata/xarray and post a summary of it on issue 1198.",
     [("get_pull_request", {"owner": "pydata", "repo": "xarray", "pullNumber": "1203"}),
      ("add_issue_comment", {"owner": "pydata", "repo": "xarray", "issue_number": "1198", "body": "<node-0>"})], []),
    ("rerun run 9876543210 in acme/api and then list the ci.yml runs so I can watch it",
     [("rerun_workflow_run", {"owner": "acme", "repo": "api", "run_id": "9876543210"}),
      ("list_workflow_runs", {"owner": "acme", "repo": "api", "workflow_id": "ci.yml"})], [(0, 1)]),
    ("get release v2.4.0 of octo-org/web-app -> comment it on issue 1001",
     [("get_release_by_tag", {"owner": "octo-org", "repo": "web-app", "tag": "v2.4.0"}),
      ("add_issue_comment", {"owner": "octo-org", "repo": "web-app", "issue_number": "1001", "body": "<node-0>"})],
     []),
    ("Create an issue 'Upgrade to Node 22' in acme/api, then open a PR from chore/node-22 to main titled \"Node 22 "
     "upgrade\" that references the new issue.",
     [("create_issue", {"owner": "acme", "repo": "api", "title": "Upgrade to Node 22"}),
      ("create_pull_request", {"owner": "acme", "repo": "api", "head": "chore/node-22", "base": "main",
                               "title": "Node 22 upgrade", "body": "<node-0>"})], []),
    ("pls list the queued build.yml runs in acme/payments-service then rerun the oldest one",
     [("list_workflow_runs", {"owner": "acme", "repo": "payments-service", "workflow_id": "build.yml",
                              "status": "queued"}),
      ("rerun_workflow_run", {"owner": "acme", "repo": "payments-service", "run_id": "<node-0>"})], []),
    ("read grafana/loki issue 2045 and open a tracking issue in acme/observability titled 'Track upstream "
     "loki#2045' with its contents",
     [("get_issue", {"owner": "grafana", "repo": "loki", "issue_number": "2045"}),
      ("create_issue", {"owner": "acme", "repo": "observability", "title": "Track upstream loki#2045",
                        "body": "<node-0>"})], []),
    ("hey so PR 77 in acme/payments-service is finally green, could you squash it and then ping issue 70 with "
     "'ledger fix is in main now'",
     [("merge_pull_request", {"owner": "acme", "repo": "payments-service", "pullNumber": "77",
                              "merge_method": "squash"}),
      ("add_issue_comment", {"owner": "acme", "repo": "payments-service", "issue_number": "70",
                             "body": "ledger fix is in main now"})], [(0, 1)]),
    ("what's the latest nimbus-io/cli release? after that, list the closed PRs against main",
     [("get_latest_release", {"owner": "nimbus-io", "repo": "cli"}),
      ("list_pull_requests", {"owner": "nimbus-io", "repo": "cli", "state": "closed", "base": "main"})], [(0, 1)]),
    ("Find the latest nightly.yml run on main in kestrel-labs/ingest, re-run it, and comment the outcome on issue 52.",
     [("list_workflow_runs", {"owner": "kestrel-labs", "repo": "ingest", "workflow_id": "nightly.yml",
                              "branch": "main"}),
      ("rerun_workflow_run", {"owner": "kestrel-labs", "repo": "ingest", "run_id": "<node-0>"}),
      ("add_issue_comment", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "52", "body": "<node-1>"})],
     []),
    ("check PR 958 in octo-org/web-app, squash-merge it, then grab the newest release",
     [("get_pull_request", {"owner": "octo-org", "repo": "web-app", "pullNumber": "958"}),
      ("merge_pull_request", {"owner": "octo-org", "repo": "web-app", "pullNumber": "958", "merge_method": "squash"}),
      ("get_latest_release", {"owner": "octo-org", "repo": "web-app"})], [(0, 1), (1, 2)]),
    ('Read issue 4410 in pydata/xarray, open a PR from fix/4410-dtype into main titled "Fix dtype promotion in '
     'concat" describing it, and rebase-merge that PR.',
     [("get_issue", {"owner": "pydata", "repo": "xarray", "issue_number": "4410"}),
      ("create_pull_request", {"owner": "pydata", "repo": "xarray", "head": "fix/4410-dtype", "base": "main",
                               "title": "Fix dtype promotion in concat", "body": "<node-0>"}),
      ("merge_pull_request", {"owner": "pydata", "repo": "xarray", "pullNumber": "<node-1>",
                              "merge_method": "rebase"})], []),
    ("1) list the release.yml runs by priya-k in acme/api 2) rerun the top one 3) tell PR 42 about it",
     [("list_workflow_runs", {"owner": "acme", "repo": "api", "workflow_id": "release.yml", "actor": "priya-k"}),
      ("rerun_workflow_run", {"owner": "acme", "repo": "api", "run_id": "<node-0>"}),
      ("add_issue_comment", {"owner": "acme", "repo": "api", "issue_number": "42", "body": "<node-1>"})], []),
    # -- DAGs: one result used twice, or steps that do not depend on each other ---------------------
    ("show me PR 42 and issue 1287 in acme/api",
     [("get_pull_request", {"owner": "acme", "repo": "api", "pullNumber": "42"}),
      ("get_issue", {"owner": "acme", "repo": "api", "issue_number": "1287"})], []),
    ("latest release of grafana/loki, and also what shipped in v2.9.0?",
     [("get_latest_release", {"owner": "grafana", "repo": "loki"}),
      ("get_release_by_tag", {"owner": "grafana", "repo": "loki", "tag": "v2.9.0"})], []),
    ("find the latest ci.yml run on main in acme/api, rerun it, and also comment the run's details on PR 42",
     [("list_workflow_runs", {"owner": "acme", "repo": "api", "workflow_id": "ci.yml", "branch": "main"}),
      ("rerun_workflow_run", {"owner": "acme", "repo": "api", "run_id": "<node-0>"}),
      ("add_issue_comment", {"owner": "acme", "repo": "api", "issue_number": "42", "body": "<node-0>"})], []),
    ("get release v1.0.0-rc.2 of kestrel-labs/ingest, open an issue titled 'rc.2 regressions' with its notes, and "
     "comment the same notes on issue 61",
     [("get_release_by_tag", {"owner": "kestrel-labs", "repo": "ingest", "tag": "v1.0.0-rc.2"}),
      ("create_issue", {"owner": "kestrel-labs", "repo": "ingest", "title": "rc.2 regressions", "body": "<node-0>"}),
      ("add_issue_comment", {"owner": "kestrel-labs", "repo": "ingest", "issue_number": "61", "body": "<node-0>"})],
     []),
    ("open a PR in nimbus-io/cli from chore/deps to main titled 'Update deps', comment 'please review @mchen' on "
     "it, and once that's done merge it",
     [("create_pull_request", {"owner": "nimbus-io", "repo": "cli", "head": "chore/deps", "base": "main",
                               "title": "Update deps"}),
      ("add_issue_comment", {"owner": "nimbus-io", "repo": "cli", "issue_number": "<node-0>",
                             "body": "please review @mchen"}),
      ("merge_pull_request", {"owner": "nimbus-io", "repo": "cli", "pullNumber": "<node-0>"})], [(1, 2)]),
    ("two things for octo-org/web-app: the PRs into release/2.3, and the deploy.yml runs",
     [("list_pull_requests", {"owner": "octo-org", "repo": "web-app", "base": "release/2.3"}),
      ("list_workflow_runs", {"owner": "octo-org", "repo": "web-app", "workflow_id": "deploy.yml"})], []),
    ("Get issue 56 and PR 57 on nimbus-io/cli, then post the PR's summary as a comment on issue 56.",
     [("get_issue", {"owner": "nimbus-io", "repo": "cli", "issue_number": "56"}),
      ("get_pull_request", {"owner": "nimbus-io", "repo": "cli", "pullNumber": "57"}),
      ("add_issue_comment", {"owner": "nimbus-io", "repo": "cli", "issue_number": "56", "body": "<node-1>"})],
     [(0, 2)]),
    ('check the issues in kestrel-labs/ingest and its latest release, then open an issue titled "Release '
     'blockers for next cut" listing the issues',
     [("list_issues", {"owner": "kestrel-labs", "repo": "ingest"}),
      ("get_latest_release", {"owner": "kestrel-labs", "repo": "ingest"}),
      ("create_issue", {"owner": "kestrel-labs", "repo": "ingest", "title": "Release blockers for next cut",
                        "body": "<node-0>"})], [(1, 2)]),
    ("rerun run 11223344556 in octo-org/web-app and meanwhile comment 'rerunning CI, hang tight' on PR 977",
     [("rerun_workflow_run", {"owner": "octo-org", "repo": "web-app", "run_id": "11223344556"}),
      ("add_issue_comment", {"owner": "octo-org", "repo": "web-app", "issue_number": "977",
                             "body": "rerunning CI, hang tight"})], []),
    ("fetch PR 1203 of pydata/xarray, merge it via rebase, and post its description on issue 1198",
     [("get_pull_request", {"owner": "pydata", "repo": "xarray", "pullNumber": "1203"}),
      ("merge_pull_request", {"owner": "pydata", "repo": "xarray", "pullNumber": "1203", "merge_method": "rebase"}),
      ("add_issue_comment", {"owner": "pydata", "repo": "xarray", "issue_number": "1198", "body": "<node-0>"})],
     [(0, 1)]),
    ("Before the release meeting I'd love an overview of acme/payments-service: the open pull requests, the "
     "issues with state CLOSED since 2025-08-01, and the latest release.",
     [("list_pull_requests", {"owner": "acme", "repo": "payments-service", "state": "open"}),
      ("list_issues", {"owner": "acme", "repo": "payments-service", "state": "CLOSED", "since": "2025-08-01"}),
      ("get_latest_release", {"owner": "acme", "repo": "payments-service"})], []),
    ("@bot new issue in jlee/dotfiles called 'zsh startup is slow' + merge pr 58 there (unrelated) ty",
     [("create_issue", {"owner": "jlee", "repo": "dotfiles", "title": "zsh startup is slow"}),
      ("merge_pull_request", {"owner": "jlee", "repo": "dotfiles", "pullNumber": "58"})], []),
]

# Requests this family must refuse: graph null. Each was checked against the twelve tools above, not against
# the full upstream server (which can, e.g., close a PR or cancel a run: those tools are not in this catalog).
KINDS = ("near_miss_action", "near_miss_object", "domain_question", "other_domain")
NEGATIVES: list[tuple[str, str]] = [
    # an action on issues, PRs, runs or releases that none of the twelve tools performs
    ("near_miss_action", "close PR 42 in acme/api without merging, we went another way"),
    ("near_miss_action", "Please close issue #88 in octo-org/web-app, it's fixed."),
    ("near_miss_action", "delete the acme/api repository"),
    ("near_miss_action", "cancel workflow run 9876543210 in acme/api, it's been stuck for an hour"),
    ("near_miss_action", "add the label 'bug' to issue 17 in kestrel-labs/ingest"),
    ("near_miss_action", "assign issue 56 on nimbus-io/cli to mchen"),
    ("near_miss_action", "approve PR 311 in acme/payments-service"),
    ("near_miss_action", "can you request a review from @dana on PR 958 in octo-org/web-app?"),
    ("near_miss_action", "publish a new release v2.5.0 for octo-org/web-app with the notes from the changelog"),
    ("near_miss_action", "revert the v1.0.0-rc.2 release in kestrel-labs/ingest, delete it entirely"),
    ("near_miss_action", "trigger the deploy.yml workflow on main in acme/api"),
    ("near_miss_action", "download the logs of run 11223344556 in octo-org/web-app"),
    ("near_miss_action", "rename issue 2045 in grafana/loki to 'Querier OOM on large label sets'"),
    ("near_miss_action", "lock the conversation on pydata/xarray issue 4410, it's getting heated"),
    ("near_miss_action", "revert the merge of PR 77 in acme/payments-service"),
    # a family-like action on an object no tool handles
    ("near_miss_object", "create a gist with my .vimrc"),
    ("near_miss_object", "update the 'Onboarding' wiki page in acme/api with the new setup steps"),
    ("near_miss_object", "open a Jira ticket in project PAY for the rate limiter bug"),
    ("near_miss_object", "list the branches of acme/api"),
    ("near_miss_object", "star grafana/loki for me"),
    ("near_miss_object", "start a discussion in octo-org/web-app about the Q4 roadmap"),
    ("near_miss_object", "create a GitLab merge request from feature/x into main in platform/billing"),
    ("near_miss_object", "show the Dependabot alerts for acme/payments-service"),
    ("near_miss_object", "add a card to the 'Q3 Roadmap' project board"),
    ("near_miss_object", "what's in the README.md of nimbus-io/cli?"),
    # questions about the domain rather than requests to act
    ("domain_question", "what's the difference between squash and rebase merging?"),
    ("domain_question", "what is a rebase?"),
    ("domain_question", "how do matrix builds work in GitHub Actions?"),
    ("domain_question", "should I use semantic versioning for my releases?"),
    ("domain_question", "why does GitHub say my PR has conflicts, and how do I fix them?"),
    ("domain_question", "any tips for writing a good pull request description?"),
    ("domain_question", "what does the workflow_dispatch trigger do?"),
    # other assistants' requests
    ("other_domain", "set the living room to 21 degrees"),
    ("other_domain", "book a table for two at 8 pm tonight"),
    ("other_domain", "what's the weather in Berlin tomorrow?"),
    ("other_domain", "email Priya that the standup moved to 10:30"),
    ("other_domain", "play some lo-fi on Spotify"),
    ("other_domain", "convert 250 USD to EUR"),
    ("other_domain", "remind me to renew my passport next Monday"),
]


def check_value(i: int, request: str, skill: str, name: str, value: str, prop: dict, n_earlier: int) -> None:
    """A "<node-j>" reference to an earlier node, or a literal copied from the request that fits its schema."""
    ref = NODE_REF.match(value)
    if ref:
        if int(ref.group(1)) >= n_earlier:
            raise SystemExit(f"entry {i}: {skill}.{name} refers to {value}, not an earlier node")
        return
    if "<node-" in value:
        raise SystemExit(f"entry {i}: {skill}.{name} has a reference inside a longer value: {value!r}")
    if value not in request:
        raise SystemExit(f"entry {i}: value {value!r} is not in the request {request!r}")
    if "enum" in prop and value not in prop["enum"]:
        raise SystemExit(f"entry {i}: {skill}.{name} = {value!r} is not one of {prop['enum']}")
    if prop.get("type") == "number" and not value.isdigit():
        raise SystemExit(f"entry {i}: {skill}.{name} = {value!r} is not a number")


def record(i: int, request: str, nodes: list[tuple[str, dict]], links: list[tuple[int, int]], tools: dict) -> dict:
    seen = set()
    for k, (skill, args) in enumerate(nodes):
        if skill not in tools:
            raise SystemExit(f"entry {i}: unknown tool {skill}")
        if skill in seen:
            raise SystemExit(f"entry {i}: {skill} twice in one plan")
        seen.add(skill)
        schema = tools[skill]["inputSchema"]
        for name, value in args.items():
            if name not in schema.get("properties", {}):
                raise SystemExit(f"entry {i}: {skill} has no argument {name!r}")
            check_value(i, request, skill, name, value, schema["properties"][name], k)
        missing = set(schema.get("required", [])) - set(args)
        if missing:
            raise SystemExit(f"entry {i}: {skill} lacks required {sorted(missing)}")
    for s, t in links:
        if not 0 <= s < t < len(nodes):
            raise SystemExit(f"entry {i}: link {s} -> {t} does not go from an earlier node to a later one")
    return {"id": f"dt-{i:03d}", "family": FAMILY, "request": request, "graph": {
        "task_nodes": [{"task": s, "arguments": [{"name": n, "value": v} for n, v in a.items()]} for s, a in nodes],
        "task_links": [{"source": nodes[s][0], "target": nodes[t][0]} for s, t in links]}}


def structure(nodes: list, links: list) -> str:
    """single, chain (each node after the first depends on exactly the one before it) or DAG."""
    if len(nodes) == 1:
        return "single"
    deps = {k: set() for k in range(len(nodes))}
    for k, (_, args) in enumerate(nodes):
        deps[k] |= {int(m.group(1)) for v in args.values() if (m := NODE_REF.match(v))}
    for s, t in links:
        deps[t].add(s)
    return "chain" if all(deps[k] == ({k - 1} if k else set()) for k in deps) else "DAG"


def main() -> None:
    mcp = json.loads((HERE / "tools.mcp.json").read_text(encoding="utf-8"))
    tools = {t["name"]: t for t in mcp["tools"]}
    requests = set()
    counts: dict[str, int] = {}
    used: dict[str, int] = {name: 0 for name in tools}
    with open(HERE / "records.jsonl", "w", encoding="utf-8") as fh:
        for i, (request, nodes, links) in enumerate(ENTRIES, start=1):
            if request in requests:
                raise SystemExit(f"entry {i}: request written twice: {request!r}")
            requests.add(request)
            fh.write(json.dumps(record(i, request, nodes, links, tools), ensure_ascii=False) + "\n")
            kind = structure(nodes, links)
            counts[kind] = counts.get(kind, 0) + 1
            for skill, _ in nodes:
                used[skill] += 1
    unused = [name for name, n in used.items() if not n]
    if unused:
        raise SystemExit(f"tools no record uses: {unused}")
    kinds: dict[str, int] = {}
    with open(HERE / "negatives.jsonl", "w", encoding="utf-8") as fh:
        for i, (kind, request) in enumerate(NEGATIVES, start=1):
            if kind not in KINDS:
                raise SystemExit(f"negative {i}: unknown kind {kind!r}")
            if request in requests:
                raise SystemExit(f"negative {i}: request also used elsewhere: {request!r}")
            requests.add(request)
            kinds[kind] = kinds.get(kind, 0) + 1
            fh.write(json.dumps({"id": f"dt-neg-{i:03d}", "family": FAMILY, "request": request, "graph": None,
                                 "kind": kind}, ensure_ascii=False) + "\n")
    # The same catalog as an OpenAI function-calling tools list.
    openai = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["inputSchema"]}} for t in mcp["tools"]]
    (HERE / "tools.json").write_text(json.dumps(openai, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(ENTRIES)} records ({counts}) to records.jsonl, {len(NEGATIVES)} negatives ({kinds}) to "
          f"negatives.jsonl, {len(tools)} tools to tools.json")
    print("nodes per tool:", used)


if __name__ == "__main__":
    main()
