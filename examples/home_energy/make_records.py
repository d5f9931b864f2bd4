"""Write records.jsonl (and tools.mcp.json) for the home_energy example family.

Every request below was written by hand, in the styles users actually type: terse commands, polite asks,
questions, chat shorthand, long preambles, multi-step instructions. The script only turns the short node
notation into the record format and checks what a template could not get wrong but a hand could: every
literal argument value appears verbatim in its request, every argument is declared by tools.json (required
ones present), and no skill appears twice in a plan (the decoder forbids it).

    .venv/bin/python examples/home_energy/make_records.py      # rewrites records.jsonl and tools.mcp.json
"""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILY = "home_energy"

# (request, [(skill, {argument: value})], extra links as (source node, target node))
# "<node-j>" is the output of node j; it implies the link j -> this node, so only ordering without data
# flow needs an explicit link.
ENTRIES: list[tuple[str, list[tuple[str, dict]], list[tuple[int, int]]]] = [
    # -- one step -------------------------------------------------------------------------------
    ("What's the electricity meter reading?", [("get_meter_reading", {"meter": "electricity"})], []),
    ("gas meter reading for last month", [("get_meter_reading", {"meter": "gas", "period": "last month"})], []),
    ("Could you tell me how much water we used this week?",
     [("get_meter_reading", {"meter": "water", "period": "this week"})], []),
    ("electricity usage yesterday", [("get_meter_reading", {"meter": "electricity", "period": "yesterday"})], []),
    ("Hey, pull the gas meter for January please", [("get_meter_reading", {"meter": "gas", "period": "January"})], []),
    ("What's the gas reading?", [("get_meter_reading", {"meter": "gas"})], []),
    ("water meter, last 30 days", [("get_meter_reading", {"meter": "water", "period": "last 30 days"})], []),
    ("I need the electricity meter reading for March for my expense report.",
     [("get_meter_reading", {"meter": "electricity", "period": "March"})], []),
    ("How much sun are we expecting tomorrow?", [("get_solar_forecast", {"day": "tomorrow"})], []),
    ("solar forecast saturday", [("get_solar_forecast", {"day": "saturday"})], []),
    ("Will the panels produce much on Friday?", [("get_solar_forecast", {"day": "Friday"})], []),
    ("Please check the solar outlook for next Monday.", [("get_solar_forecast", {"day": "next Monday"})], []),
    ("pv generation estimate for the 14th?", [("get_solar_forecast", {"day": "the 14th"})], []),
    ("What are the electricity prices today?", [("get_tariff_prices", {"day": "today"})], []),
    ("tariff tomorrow", [("get_tariff_prices", {"day": "tomorrow"})], []),
    ("Can you show me the hourly rates for Sunday?", [("get_tariff_prices", {"day": "Sunday"})], []),
    ("Any idea what the rates look like on Wednesday?", [("get_tariff_prices", {"day": "Wednesday"})], []),
    ("how full is the home battery", [("get_battery_level", {})], []),
    ("Battery status?", [("get_battery_level", {})], []),
    ("Is the powerwall charged yet?", [("get_battery_level", {})], []),
    ("Put the battery in backup mode.", [("set_battery_mode", {"mode": "backup"})], []),
    ("switch battery to self-consumption until 6 pm",
     [("set_battery_mode", {"mode": "self-consumption", "until": "6 pm"})], []),
    ("Please set the battery to charge mode until midnight, thanks",
     [("set_battery_mode", {"mode": "charge", "until": "midnight"})], []),
    ("battery: discharge", [("set_battery_mode", {"mode": "discharge"})], []),
    ("Could you put the battery on grid charging until 7:00?",
     [("set_battery_mode", {"mode": "grid charging", "until": "7:00"})], []),
    ("Hi! We're heading away for the weekend, so could you please set the battery to backup mode until Monday?",
     [("set_battery_mode", {"mode": "backup", "until": "Monday"})], []),
    ("Set the living room to 21 degrees.", [("set_thermostat", {"room": "living room", "temperature": "21"})], []),
    ("bedroom thermostat 18", [("set_thermostat", {"room": "bedroom", "temperature": "18"})], []),
    ("It's freezing in the office, can you bump it to 23?",
     [("set_thermostat", {"room": "office", "temperature": "23"})], []),
    ("Would you mind lowering the kids' room to 19.5?",
     [("set_thermostat", {"room": "kids' room", "temperature": "19.5"})], []),
    ("heat the bathroom to 24 please", [("set_thermostat", {"room": "bathroom", "temperature": "24"})], []),
    ("set the hallway to 20", [("set_thermostat", {"room": "hallway", "temperature": "20"})], []),
    ("ok so the heating's off in the study, set it to 21 pls",
     [("set_thermostat", {"room": "study", "temperature": "21"})], []),
    ("Run the dishwasher at 2 am.", [("schedule_appliance", {"appliance": "dishwasher", "start_time": "2 am"})], []),
    ("start washing machine 13:30",
     [("schedule_appliance", {"appliance": "washing machine", "start_time": "13:30"})], []),
    ("Can you schedule the dryer for 10 pm tonight?",
     [("schedule_appliance", {"appliance": "dryer", "start_time": "10 pm tonight"})], []),
    ("Start the EV charger at 23:00", [("schedule_appliance", {"appliance": "EV charger", "start_time": "23:00"})], []),
    ("please set the pool pump to come on at 11 am",
     [("schedule_appliance", {"appliance": "pool pump", "start_time": "11 am"})], []),
    ("Before the peak tariff kicks in, I'd like the dishwasher to start at 5:30 am.",
     [("schedule_appliance", {"appliance": "dishwasher", "start_time": "5:30 am"})], []),
    ("Email Ana the message 'meter reader comes Thursday'",
     [("send_energy_report", {"recipient": "Ana", "content": "meter reader comes Thursday"})], []),
    ("send dad a note: battery is full", [("send_energy_report", {"recipient": "dad", "content": "battery is full"})], []),
    ("Let Priya know that the heating is back on.",
     [("send_energy_report", {"recipient": "Priya", "content": "the heating is back on"})], []),
    # -- chains ---------------------------------------------------------------------------------
    ("Read the electricity meter for this month and send it to Ana.",
     [("get_meter_reading", {"meter": "electricity", "period": "this month"}),
      ("send_energy_report", {"recipient": "Ana", "content": "<node-0>"})], []),
    ("get tomorrow's tariff prices then run the dishwasher at the cheapest hour",
     [("get_tariff_prices", {"day": "tomorrow"}),
      ("schedule_appliance", {"appliance": "dishwasher", "start_time": "<node-0>"})], []),
    ("check the solar forecast for Saturday and email it to Marco",
     [("get_solar_forecast", {"day": "Saturday"}), ("send_energy_report", {"recipient": "Marco", "content": "<node-0>"})], []),
    ("how full is the battery? text the answer to Leo",
     [("get_battery_level", {}), ("send_energy_report", {"recipient": "Leo", "content": "<node-0>"})], []),
    ("Look up today's prices and start the EV charger when it's cheapest",
     [("get_tariff_prices", {"day": "today"}),
      ("schedule_appliance", {"appliance": "EV charger", "start_time": "<node-0>"})], []),
    ("gas meter last week -> send to landlord",
     [("get_meter_reading", {"meter": "gas", "period": "last week"}),
      ("send_energy_report", {"recipient": "landlord", "content": "<node-0>"})], []),
    ("Could you check the battery level and then switch it to backup mode?",
     [("get_battery_level", {}), ("set_battery_mode", {"mode": "backup"})], [(0, 1)]),
    ("Put the battery in discharge mode until 9 pm and then set the living room to 22.",
     [("set_battery_mode", {"mode": "discharge", "until": "9 pm"}),
      ("set_thermostat", {"room": "living room", "temperature": "22"})], [(0, 1)]),
    ("Find Sunday's tariff, schedule the washing machine for the cheapest slot, then tell Grace when it will run.",
     [("get_tariff_prices", {"day": "Sunday"}),
      ("schedule_appliance", {"appliance": "washing machine", "start_time": "<node-0>"}),
      ("send_energy_report", {"recipient": "Grace", "content": "<node-1>"})], []),
    ("solar forecast for tomorrow, then run the pool pump at peak sun",
     [("get_solar_forecast", {"day": "tomorrow"}),
      ("schedule_appliance", {"appliance": "pool pump", "start_time": "<node-0>"})], []),
    ("Please read the water meter for this quarter and forward the numbers to the accountant.",
     [("get_meter_reading", {"meter": "water", "period": "this quarter"}),
      ("send_energy_report", {"recipient": "accountant", "content": "<node-0>"})], []),
    ("What's the battery at? Then set it to charge until 5 am.",
     [("get_battery_level", {}), ("set_battery_mode", {"mode": "charge", "until": "5 am"})], [(0, 1)]),
    ("Get the sun forecast for Thursday and send it to my husband",
     [("get_solar_forecast", {"day": "Thursday"}),
      ("send_energy_report", {"recipient": "my husband", "content": "<node-0>"})], []),
    ("bedroom to 17 then battery to backup",
     [("set_thermostat", {"room": "bedroom", "temperature": "17"}), ("set_battery_mode", {"mode": "backup"})], [(0, 1)]),
    ("I'd like the electricity reading for yesterday emailed to Sam, please.",
     [("get_meter_reading", {"meter": "electricity", "period": "yesterday"}),
      ("send_energy_report", {"recipient": "Sam", "content": "<node-0>"})], []),
    ("check tariff prices for tomorrow and send them to the house group chat",
     [("get_tariff_prices", {"day": "tomorrow"}),
      ("send_energy_report", {"recipient": "the house group chat", "content": "<node-0>"})], []),
    ("Grab Monday's prices, then set the dishwasher to start at the cheapest time",
     [("get_tariff_prices", {"day": "Monday"}),
      ("schedule_appliance", {"appliance": "dishwasher", "start_time": "<node-0>"})], []),
    ("Look at how much solar we'll get on Sunday and schedule the washing machine for the sunniest hour.",
     [("get_solar_forecast", {"day": "Sunday"}),
      ("schedule_appliance", {"appliance": "washing machine", "start_time": "<node-0>"})], []),
    ("battery level -> Omar",
     [("get_battery_level", {}), ("send_energy_report", {"recipient": "Omar", "content": "<node-0>"})], []),
    ("Set the office to 20 and let Jamal know it's done",
     [("set_thermostat", {"room": "office", "temperature": "20"}),
      ("send_energy_report", {"recipient": "Jamal", "content": "<node-0>"})], []),
    ("Switch the battery to backup until Tuesday, then text Nadia that the storm prep is done",
     [("set_battery_mode", {"mode": "backup", "until": "Tuesday"}),
      ("send_energy_report", {"recipient": "Nadia", "content": "the storm prep is done"})], [(0, 1)]),
    ("Read the gas meter for this winter and send the figure to Hugo",
     [("get_meter_reading", {"meter": "gas", "period": "this winter"}),
      ("send_energy_report", {"recipient": "Hugo", "content": "<node-0>"})], []),
    ("Start the dryer at 15:00 and then tell Vera the laundry will be ready",
     [("schedule_appliance", {"appliance": "dryer", "start_time": "15:00"}),
      ("send_energy_report", {"recipient": "Vera", "content": "the laundry will be ready"})], [(0, 1)]),
    ("Check the battery, switch it to grid charging until 6 am, and message Tara the result",
     [("get_battery_level", {}), ("set_battery_mode", {"mode": "grid charging", "until": "6 am"}),
      ("send_energy_report", {"recipient": "Tara", "content": "<node-1>"})], [(0, 1)]),
    ("Get tomorrow's solar forecast, run the EV charger at the best hour, and email Kenji the plan",
     [("get_solar_forecast", {"day": "tomorrow"}),
      ("schedule_appliance", {"appliance": "EV charger", "start_time": "<node-0>"}),
      ("send_energy_report", {"recipient": "Kenji", "content": "<node-1>"})], []),
    ("first the meter reading (electricity, today), then text it to Zoe",
     [("get_meter_reading", {"meter": "electricity", "period": "today"}),
      ("send_energy_report", {"recipient": "Zoe", "content": "<node-0>"})], []),
    ("Could you lower the living room to 19 and afterwards put the battery in self-consumption mode?",
     [("set_thermostat", {"room": "living room", "temperature": "19"}),
      ("set_battery_mode", {"mode": "self-consumption"})], [(0, 1)]),
    ("tariffs for Saturday pls, and send them over to Luis",
     [("get_tariff_prices", {"day": "Saturday"}), ("send_energy_report", {"recipient": "Luis", "content": "<node-0>"})], []),
    ("Check the water meter for August, then email the reading to the building manager.",
     [("get_meter_reading", {"meter": "water", "period": "August"}),
      ("send_energy_report", {"recipient": "the building manager", "content": "<node-0>"})], []),
    ("Dear assistant, kindly forward today's tariff prices to accounts@example.com.",
     [("get_tariff_prices", {"day": "today"}),
      ("send_energy_report", {"recipient": "accounts@example.com", "content": "<node-0>"})], []),
    # -- DAGs: one result used twice, or steps that do not depend on each other ---------------------
    ("Check tomorrow's prices, run the dishwasher at the cheapest hour and text Ana the prices",
     [("get_tariff_prices", {"day": "tomorrow"}),
      ("schedule_appliance", {"appliance": "dishwasher", "start_time": "<node-0>"}),
      ("send_energy_report", {"recipient": "Ana", "content": "<node-0>"})], []),
    ("Set the bedroom to 19 and the battery to backup mode.",
     [("set_thermostat", {"room": "bedroom", "temperature": "19"}), ("set_battery_mode", {"mode": "backup"})], []),
    ("What's the battery level and what's the solar forecast for tomorrow?",
     [("get_battery_level", {}), ("get_solar_forecast", {"day": "tomorrow"})], []),
    ("Get Sunday's solar forecast and send it to Maya, and use it to schedule the pool pump too",
     [("get_solar_forecast", {"day": "Sunday"}),
      ("send_energy_report", {"recipient": "Maya", "content": "<node-0>"}),
      ("schedule_appliance", {"appliance": "pool pump", "start_time": "<node-0>"})], []),
    ("Read the gas meter and check the electricity tariff for today",
     [("get_meter_reading", {"meter": "gas"}), ("get_tariff_prices", {"day": "today"})], []),
    ("Look up Friday's rates and the solar forecast for Friday, then schedule the EV charger",
     [("get_tariff_prices", {"day": "Friday"}), ("get_solar_forecast", {"day": "Friday"}),
      ("schedule_appliance", {"appliance": "EV charger", "start_time": "<node-0>"})], [(1, 2)]),
    ("Put the office at 21, start the washing machine at 9:00, and check how full the battery is",
     [("set_thermostat", {"room": "office", "temperature": "21"}),
      ("schedule_appliance", {"appliance": "washing machine", "start_time": "9:00"}),
      ("get_battery_level", {})], []),
    ("check today's prices; switch the battery to discharge until 8 pm and email Carla the prices",
     [("get_tariff_prices", {"day": "today"}), ("set_battery_mode", {"mode": "discharge", "until": "8 pm"}),
      ("send_energy_report", {"recipient": "Carla", "content": "<node-0>"})], [(0, 1)]),
    ("Check the electricity meter for last week, send it to Iris, and switch the battery to self-consumption",
     [("get_meter_reading", {"meter": "electricity", "period": "last week"}),
      ("send_energy_report", {"recipient": "Iris", "content": "<node-0>"}),
      ("set_battery_mode", {"mode": "self-consumption"})], []),
    ("Heat the bathroom to 23 and run the dryer at 4 pm",
     [("set_thermostat", {"room": "bathroom", "temperature": "23"}),
      ("schedule_appliance", {"appliance": "dryer", "start_time": "4 pm"})], []),
    ("Get tomorrow's forecast for the panels and tomorrow's tariffs, then tell Will which hours look best",
     [("get_solar_forecast", {"day": "tomorrow"}), ("get_tariff_prices", {"day": "tomorrow"}),
      ("send_energy_report", {"recipient": "Will", "content": "<node-0>"})], [(1, 2)]),
    ("Quick one: battery level, and set the kitchen to 20.",
     [("get_battery_level", {}), ("set_thermostat", {"room": "kitchen", "temperature": "20"})], []),
    ("Look up Monday's tariff, start the washing machine at the cheapest hour, and keep the battery in charge mode until then",
     [("get_tariff_prices", {"day": "Monday"}),
      ("schedule_appliance", {"appliance": "washing machine", "start_time": "<node-0>"}),
      ("set_battery_mode", {"mode": "charge", "until": "<node-0>"})], []),
]


def record(i: int, request: str, nodes: list[tuple[str, dict]], links: list[tuple[int, int]], tools: dict) -> dict:
    seen = set()
    for skill, args in nodes:
        if skill in seen:
            raise SystemExit(f"entry {i}: {skill} twice in one plan")
        seen.add(skill)
        props = tools[skill]["parameters"]
        for name, value in args.items():
            if name not in props.get("properties", {}):
                raise SystemExit(f"entry {i}: {skill} has no argument {name!r}")
            if not value.startswith("<node-") and value not in request:
                raise SystemExit(f"entry {i}: value {value!r} is not in the request {request!r}")
        missing = set(props.get("required", [])) - set(args)
        if missing:
            raise SystemExit(f"entry {i}: {skill} lacks required {sorted(missing)}")
    return {"id": f"he-{i:03d}", "family": FAMILY, "request": request, "graph": {
        "task_nodes": [{"task": s, "arguments": [{"name": n, "value": v} for n, v in a.items()]} for s, a in nodes],
        "task_links": [{"source": nodes[s][0], "target": nodes[t][0]} for s, t in links]}}


def main() -> None:
    tools = {t["function"]["name"]: t["function"] for t in json.loads((HERE / "tools.json").read_text())}
    with open(HERE / "records.jsonl", "w", encoding="utf-8") as fh:
        for i, (request, nodes, links) in enumerate(ENTRIES, start=1):
            fh.write(json.dumps(record(i, request, nodes, links, tools), ensure_ascii=False) + "\n")
    # The same catalog as an MCP tools/list result: name, description, inputSchema.
    mcp = {"tools": [{"name": f["name"], "description": f["description"], "inputSchema": f["parameters"]}
                     for f in tools.values()]}
    (HERE / "tools.mcp.json").write_text(json.dumps(mcp, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(ENTRIES)} records to {HERE / 'records.jsonl'} and {HERE / 'tools.mcp.json'}")


if __name__ == "__main__":
    main()
