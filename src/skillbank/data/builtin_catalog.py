"""Skill definitions, phrasing templates and value pools of the built-in benchmark.

This module is data; :mod:`skillbank.data.builtin` turns it into a catalog and samples requests.

A skill has typed arguments. Each argument draws its literal values from a named value *pool* and may
*accept* the output of an earlier skill: media/text tools by type (``text``, ``image``, ``audio``,
``video``, ``url``), daily-life tools by role (``info`` such as a forecast can become the ``content``
of a message; ``flights`` found by a search can be booked). Outputs of type ``label`` (a category, a
score) feed nothing. A skill's *noun* ("the transcript") is how later clauses refer to its output;
nouns are unique within a family, so a reference always names exactly one earlier node.

Clause templates are imperative verb phrases with ``{argument}`` slots. A slot is filled with the
literal value (quoted when it is free text) or, when the argument consumes an earlier node, with a
reference phrase ("it", "the result", the producer's noun). Every template must read well both ways.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

# -- value pools --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """Literal values for one kind of argument: a fixed list or a generator over a private RNG."""

    values: tuple[str, ...] = ()
    make: Callable[[random.Random], str] | None = None
    quote: bool = False  # free text is written in double quotes so its boundaries are clear

    def sample(self, rng: random.Random) -> str:
        return self.make(rng) if self.make else rng.choice(self.values)


def _files(stems: str, exts: str, top: int = 60) -> Callable[[random.Random], str]:
    stems_, exts_ = stems.split(), exts.split()

    def make(rng: random.Random) -> str:
        stem = rng.choice(stems_)
        if rng.random() < 0.75:
            stem = f"{stem}_{rng.randint(1, top)}"
        return f"{stem}.{rng.choice(exts_)}"
    return make


def _url(kind_paths: str, exts: str = "") -> Callable[[random.Random], str]:
    hosts = ["example.com", "files.example.org", "media.example.net", "cdn.example.io", "mysite.example"]
    paths, exts_ = kind_paths.split(), exts.split()

    def make(rng: random.Random) -> str:
        name = f"{rng.choice(paths)}{rng.randint(1, 99)}"
        return f"https://{rng.choice(hosts)}/{name}" + (f".{rng.choice(exts_)}" if exts_ else "")
    return make


FIRST_NAMES = ("Anna Ben Carla David Elena Farid Grace Hugo Iris Jamal Kenji Lena Marco Nadia Omar Priya "
               "Quinn Rosa Sam Tara Umar Vera Will Yara Zoe Leo Maya Noah Ava Luis").split()
CITIES = ("Paris London Tokyo Berlin Madrid Rome Chicago Boston Denver Seattle Toronto Sydney Dublin Lisbon "
          "Vienna Prague Oslo Athens Seoul Mumbai Cairo Austin Miami Montreal Zurich Dubai Singapore").split()
MONTHS = "January February March April May June July August September October November December".split()


def _date(rng: random.Random) -> str:
    style = rng.random()
    if style < 0.45:
        return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"
    if style < 0.8:
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return rng.choice(["tomorrow", "next Monday", "next Friday", "this Saturday", "next weekend", "Sunday"])


def _time(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return f"{rng.randint(1, 12)}:{rng.choice(['00', '15', '30', '45'])} {rng.choice(['AM', 'PM'])}"
    return f"{rng.randint(5, 22):02d}:{rng.choice(['00', '10', '20', '30', '40', '50'])}"


def _money(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return f"${rng.randint(5, 900)}"
    return f"${rng.randint(5, 1500)}.{rng.randint(0, 99):02d}"


def _phone(rng: random.Random) -> str:
    style = rng.random()
    if style < 0.4:
        return f"555-{rng.randint(0, 9999):04d}"
    if style < 0.7:
        return f"+1 {rng.randint(200, 989)} 555 {rng.randint(0, 9999):04d}"
    return f"({rng.randint(200, 989)}) 555-{rng.randint(0, 9999):04d}"


def _email(rng: random.Random) -> str:
    name = rng.choice(FIRST_NAMES).lower()
    sep = rng.choice([".", "_", ""])
    last = rng.choice(["smith", "lee", "garcia", "chen", "khan", "novak", "rossi", "mori", "berg", "silva"])
    return f"{name}{sep}{last}@{rng.choice(['example.com', 'mail.example.org', 'work.example.net'])}"


def _text_with_url(rng: random.Random) -> str:
    url = _url("sale deals event blog post docs signup")(rng)
    lead = rng.choice(["The full schedule is posted at", "You can register at", "Read the announcement at",
                       "All the photos are up at", "Our new menu is at", "The slides are available at"])
    return f"{lead} {url}"


def _address(rng: random.Random) -> str:
    street = rng.choice(["Oak Lane", "Elm Street", "Main Street", "Park Avenue", "River Road", "Hill Drive"])
    return f"{rng.randint(2, 250)} {street}"


def _flight(rng: random.Random) -> str:
    return f"{rng.choice(['UA', 'BA', 'LH', 'AF', 'DL', 'KL', 'IB', 'QF', 'AC', 'EK'])} {rng.randint(10, 999)}"


POOLS: dict[str, Pool] = {
    # media and text inputs (shared across the media families on purpose)
    "image": Pool(make=_files("photo img beach selfie scan sketch poster portrait street garden family pet",
                              "jpg png")),
    "audio": Pool(make=_files("memo recording interview podcast voice_note lecture song call meeting",
                              "wav mp3 m4a", 40)),
    "video": Pool(make=_files("clip video vlog footage trailer drone_shot wedding tutorial", "mp4 mov", 40)),
    "document": Pool(make=_files("report contract invoice lease manual minutes resume thesis statement",
                                 "pdf docx", 30)),
    "image_url": Pool(make=_url("images/pic photos/shot gallery/img", "jpg png")),
    "video_url": Pool(make=_url("videos/clip watch/v media/movie", "mp4")),
    "audio_url": Pool(make=_url("audio/track podcasts/ep sounds/file", "mp3 wav")),
    "page_url": Pool(make=_url("news/story blog/post articles/a wiki/page")),
    "text_with_url": Pool(make=_text_with_url, quote=True),
    "text": Pool(quote=True, values=(
        "The meeting has been moved to Thursday afternoon",
        "Our team finished the project two weeks ahead of schedule",
        "The new library opens downtown next spring",
        "I think the movie was far too long but the music was great",
        "Please bring your passport and a printed copy of the ticket",
        "Sales grew by twelve percent in the last quarter",
        "The weather in the mountains changes very quickly",
        "She has been learning to play the violin since she was six",
        "The train to the airport leaves every fifteen minutes",
        "We regret to inform you that the concert is cancelled",
        "The recipe needs two eggs, flour and a cup of milk",
        "Thank you for your order, it will ship within three days",
        "The museum is free on the first Sunday of every month",
        "My flight was delayed and I missed the connection",
        "The software update fixes several security problems",
        "Local farmers expect a strong harvest this year",
        "Customers love the new design but complain about the price",
        "The hotel room was clean and the staff were friendly",
        "Remember to water the plants while I am away",
        "The city council approved a new bike lane on Main Street",
        "Scientists discovered a new species of frog in the rainforest",
        "Our office will be closed on Monday for the holiday",
        "The battery lasts all day even with heavy use",
        "He apologized for the late reply and promised to call back",
        "The lecture covers the history of photography in Europe",
        "Traffic was terrible this morning because of the marathon",
        "The report shows that most users prefer the mobile app",
        "I can't wait to see everyone at the reunion next week",
        "The company plans to open three new stores in Asia",
        "Drinking enough water helps you stay focused",
        "The final exam will include questions from every chapter",
        "This summary of the budget meeting needs a second look",
        "The podcast episode about space travel was fascinating",
        "Tickets for the festival sold out in ten minutes",
        "The package arrived damaged and the screen is cracked",
        "Our volunteers planted two hundred trees last weekend",
        "The restaurant on the corner serves the best noodles in town",
        "Kids under twelve travel free on weekends",
        "The image quality of this camera is excellent in low light",
        "Voting for the new logo closes at midnight",
    )),
    "prompt": Pool(quote=True, values=(
        "a red fox sleeping in the snow", "a lighthouse on a stormy coast", "a cat wearing a tiny crown",
        "a futuristic city at sunset", "a bowl of ramen on a wooden table", "an astronaut riding a horse",
        "a cozy cabin in a pine forest", "a robot painting a portrait", "a hot air balloon over the desert",
        "children flying kites on a beach", "a vintage car on a rainy street", "a dragon made of clouds",
        "a sunflower field under a blue sky", "a busy night market in Taipei", "a whale jumping out of the sea",
        "a watercolor map of Italy", "a dog surfing a big wave", "a quiet library with tall shelves",
    )),
    "sound_prompt": Pool(quote=True, values=(
        "rain on a tin roof", "a crackling campfire", "birds singing at dawn", "a busy train station",
        "waves crashing on rocks", "a thunderstorm in the distance", "footsteps in an empty hall",
        "a cheering stadium crowd", "wind chimes in a light breeze", "a ticking clock",
        "a purring cat", "a city street at rush hour",
    )),
    "writing_prompt": Pool(values=(
        "a short poem about autumn", "a product description for a smart watch", "a birthday message for my aunt",
        "a short story about a lost robot", "a welcome speech for new employees", "a haiku about the ocean",
        "an apology note to a customer", "a toast for my brother's wedding", "a slogan for a bakery",
        "a bedtime story about a brave turtle", "a motivational quote for athletes",
        "an introduction for my travel blog", "a limerick about a lazy dog", "a thank-you note for my teacher",
    )),
    "query": Pool(quote=True, values=(
        "best hiking trails near Denver", "how to repot a cactus", "history of the Eiffel Tower",
        "cheap electric scooters", "symptoms of vitamin D deficiency", "easy vegan lasagna recipe",
        "how solar panels work", "top rated noise cancelling headphones", "rules of cricket",
        "northern lights forecast", "baby penguins", "street food in Bangkok", "how to tie a bowline knot",
        "vintage typewriters", "the tallest waterfalls in the world", "beginner yoga routine",
        "red pandas playing", "how bridges are built", "jazz concerts in New Orleans",
    )),
    "text_question": Pool(quote=True, values=(
        "Who is mentioned?", "When does it happen?", "What is the main point?", "Where is it taking place?",
        "Why was the change made?", "How many people are involved?", "What should I do next?",
        "Is the news good or bad?",
    )),
    "image_question": Pool(quote=True, values=(
        "What color is the car?", "How many people are in the picture?", "Is it raining?",
        "What is the dog holding?", "Which animal is shown?", "What does the sign say?",
        "Is the door open?", "What time does the clock show?", "What is on the table?",
    )),
    "document_question": Pool(quote=True, values=(
        "What is the total amount due?", "When does the contract end?", "Who signed it?",
        "What is the deadline?", "How many pages are there?", "What is the monthly rent?",
        "Which company issued it?", "What is the conclusion?",
    )),
    "language": Pool(values=("French", "German", "Spanish", "Italian", "Japanese", "Korean", "Portuguese",
                             "Dutch", "Arabic", "Hindi", "Turkish", "Polish", "Swedish", "Greek", "Chinese")),
    "voice": Pool(values=("deep", "robotic", "chipmunk", "whispering", "cartoon", "baritone", "squeaky", "monster")),
    "effect": Pool(values=("reverb", "echo", "distortion", "chorus", "flanger", "bass boost", "tremolo")),
    "speed": Pool(values=("2x", "1.5x", "0.5x", "0.75x", "3x", "1.25x")),
    "edit_instruction": Pool(values=(
        "make the sky purple", "remove the car in the background", "add a rainbow", "turn day into night",
        "put a hat on the dog", "replace the grass with snow", "add fireworks above the city",
        "make it look like autumn", "remove the people on the left",
    )),
    # daily life
    "city": Pool(values=tuple(CITIES)),
    "date": Pool(make=_date),
    "time": Pool(make=_time),
    "amount": Pool(make=_money),
    "phone": Pool(make=_phone),
    "email": Pool(make=_email),
    "flight": Pool(make=_flight),
    "person": Pool(values=tuple(FIRST_NAMES)),
    "message": Pool(quote=True, values=(
        "Running ten minutes late, start without me", "Happy birthday, have a great day",
        "The meeting is moved to 3 pm", "Can you pick up milk on the way home",
        "Dinner is at Marco's place tonight", "I landed safely", "Don't forget the keys",
        "The report is ready for review", "Call me when you get this", "See you at the station at noon",
        "Congratulations on the new job", "The kids are asleep, come in quietly",
        "Send me the summary when you can", "Check out the photos from the trip",
        "Just finished my first marathon", "Loving the new coffee place on Elm Street",
        "buy batteries and printer paper", "renew the car insurance before Friday",
        "ideas for the team offsite", "the translation for grandma's letter",
    )),
    "news_topic": Pool(values=("technology", "climate change", "the stock market", "football", "space exploration",
                               "electric cars", "local elections", "healthcare", "artificial intelligence",
                               "the Olympics", "housing prices", "renewable energy")),
    "stock": Pool(values=("Apple", "Tesla", "Microsoft", "Amazon", "Nvidia", "Google", "Netflix", "Toyota",
                          "AAPL", "TSLA", "MSFT")),
    "trade_action": Pool(values=("buy", "sell")),
    "hotel": Pool(values=("the Grand Plaza Hotel", "Hilton Garden Inn", "the Ritz", "Hotel Aurora",
                          "the Seaside Inn", "Marriott Downtown", "the Park Lodge", "Holiday Inn Express")),
    "restaurant": Pool(values=("Luigi's Trattoria", "Sakura Sushi", "The Green Fork", "Casa Lola", "Bistro 22",
                               "the Golden Dragon", "Spice Route", "Blue Harbor Grill")),
    "product": Pool(values=("a phone charger", "running shoes", "a coffee grinder", "a yoga mat", "wireless earbuds",
                            "a desk lamp", "a winter jacket", "a backpack", "an air purifier", "a board game")),
    "website": Pool(values=("Amazon", "eBay", "Etsy", "Walmart", "Target", "Best Buy")),
    "resale_site": Pool(values=("eBay", "Craigslist", "Facebook Marketplace", "Poshmark", "Depop")),
    "social_network": Pool(values=("Facebook", "Twitter", "Instagram", "LinkedIn", "Mastodon", "Threads")),
    "bank": Pool(values=("Chase", "Wells Fargo", "Barclays", "HSBC", "Santander", "Citibank", "ING")),
    "job": Pool(values=("data analyst", "barista", "graphic designer", "nurse", "software engineer",
                        "project manager", "sales associate", "teacher")),
    "employer": Pool(values=("Google", "Spotify", "Starbucks", "the city hospital", "Acme Corp", "IKEA",
                             "a local startup")),
    "symptom": Pool(values=("a sore throat", "back pain", "a persistent cough", "migraines", "a skin rash",
                            "trouble sleeping", "an earache", "seasonal allergies")),
    "doctor": Pool(values=("Dr. Patel", "Dr. Nguyen", "Dr. Okafor", "Dr. Schmidt", "Dr. Moreno", "Dr. Kim")),
    "legal_issue": Pool(values=("a rental dispute", "my divorce", "a parking fine", "a work contract",
                                "a car accident claim", "starting a small business", "a noisy neighbor")),
    "lawyer": Pool(values=("Ms. Alvarez", "Mr. Brooks", "Ms. Ferreira", "Mr. Tanaka", "Ms. Dubois")),
    "course": Pool(values=("Introduction to AI", "Spanish for Beginners", "Creative Writing", "Data Science 101",
                           "Photography Basics", "Financial Accounting", "Organic Chemistry")),
    "university": Pool(values=("Stanford", "MIT", "the Open University", "UCLA", "Oxford", "the community college",
                               "Coursera")),
    "insurance": Pool(values=("travel insurance", "pet insurance", "home insurance", "car insurance",
                              "health insurance", "life insurance")),
    "insurer": Pool(values=("Allianz", "Geico", "AXA", "State Farm", "Aviva", "Zurich Insurance")),
    "bill": Pool(values=("electricity", "water", "gas", "internet", "phone", "trash collection")),
    "item": Pool(values=("old bike", "used iPhone", "guitar", "sofa", "vintage camera", "baby stroller",
                         "gaming console")),
    "year": Pool(values=("2019", "2020", "2021", "2022", "2023", "2024")),
    "country": Pool(values=("France", "Germany", "Canada", "Mexico", "Japan", "India", "Brazil", "Italy",
                            "Ireland", "Kenya")),
    "card": Pool(values=("Visa", "Mastercard", "Amex", "Discover")),
    "chore": Pool(values=("vacuum the living room", "wash the dishes", "mop the kitchen floor", "do the laundry",
                          "water the plants", "fold the clothes", "clean the windows")),
    "event_title": Pool(quote=True, values=(
        "Mom's birthday", "Dentist appointment", "Team lunch", "Yoga class", "Parent-teacher meeting",
        "Car service", "Book club", "Flight to Lisbon", "Gym session", "Project deadline")),
    "package": Pool(values=("the birthday gift", "a box of books", "the signed contract", "my old laptop",
                            "a care package", "the returned shoes")),
    "address": Pool(make=_address),
    "food": Pool(values=("a large pepperoni pizza", "pad thai", "two chicken burritos", "sushi rolls",
                         "a Greek salad", "ramen", "butter chicken", "fish and chips")),
    "food_app": Pool(values=("Uber Eats", "DoorDash", "Grubhub", "Deliveroo", "Just Eat")),
    "place": Pool(values=("the airport", "Central Station", "the office", "the city museum", "the stadium",
                          "the hospital", "the convention center", "the harbor")),
    "ride_app": Pool(values=("Uber", "Lyft", "Bolt", "Grab", "FreeNow")),
    "song": Pool(quote=True, values=(
        "Bohemian Rhapsody", "Blinding Lights", "Hey Jude", "Shape of You", "Clair de Lune", "Rolling in the Deep",
        "Take Five", "Dancing Queen", "Yellow")),
    "movie": Pool(quote=True, values=(
        "Inception", "The Matrix", "Spirited Away", "Casablanca", "Finding Nemo", "The Godfather",
        "Parasite", "Jurassic Park", "Amelie")),
    "book": Pool(quote=True, values=(
        "The Great Gatsby", "Dune", "Pride and Prejudice", "The Hobbit", "Beloved", "Sapiens",
        "The Road", "Middlemarch")),
    "library": Pool(values=("the city library", "the university library", "Riverside Library",
                            "the county library", "Northgate Library")),
    "meeting_topic": Pool(values=("the quarterly budget", "the product launch", "onboarding", "the marketing plan",
                                  "the website redesign", "hiring", "the annual report", "customer feedback")),
    "software": Pool(values=("Zoom", "Photoshop", "Spotify", "VLC", "Slack", "Chrome", "Blender", "Firefox")),
    "software_action": Pool(values=("install", "uninstall", "update")),
}

# Cross-family overlap on purpose: a message may quote the same sentences the text tools work on, and
# an image or video search may look for the same scenes the generators draw.
POOLS["message"] = Pool(quote=True, values=POOLS["message"].values + POOLS["text"].values[::2])
POOLS["visual_query"] = Pool(quote=True, values=POOLS["query"].values + POOLS["prompt"].values)

# -- skills -------------------------------------------------------------------------------------

MEDIA_TYPES = ("text", "image", "audio", "video", "url")


@dataclass(frozen=True)
class ArgDef:
    name: str
    type: str  # the catalog type (ArgSpec.type)
    desc: str
    pool: str  # key in POOLS
    accepts: tuple[str, ...] = ()  # output types of earlier nodes this argument can consume


def A(name: str, desc: str, type: str | None = None, pool: str | None = None,
      accepts: tuple[str, ...] | None = None) -> ArgDef:
    """Argument shorthand: type and pool default to the name; media types accept their own type."""
    type_ = type or name
    if accepts is None:
        accepts = (type_,) if type_ in MEDIA_TYPES else ()
    return ArgDef(name, type_, desc, pool or name, accepts)


@dataclass(frozen=True)
class SkillDef:
    name: str
    desc: str
    args: tuple[ArgDef, ...]
    templates: tuple[str, ...]
    output: str | None = None  # type of the output, when other skills can refer to it
    noun: str = ""  # how a later clause names this skill's output
    ref_phrases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per-argument overrides


def S(name: str, desc: str, args: list[ArgDef], templates: list[str], output: str | None = None,
      noun: str = "", refs: dict[str, tuple[str, ...]] | None = None) -> SkillDef:
    return SkillDef(name, desc, tuple(args), tuple(templates), output, noun, dict(refs or {}))


@dataclass(frozen=True)
class FamilyDef:
    key: str
    short: str  # "t1" .. "t5", used in record ids
    title: str
    skills: tuple[SkillDef, ...]


CONTENT = A("content", "The text to send, post or note down", "string", "message", accepts=("info",))

DAILY_LIFE = FamilyDef("t1_daily_life", "t1", "Daily Life", (
    S("get_weather", "Get the weather forecast for a city on a date.",
      [A("city", "The city", "string"), A("date", "The day of the forecast", "date")],
      ["check the weather in {city} for {date}", "tell me the forecast for {city} on {date}",
       "find out what the weather will be like in {city} on {date}"], "info", "the forecast"),
    S("get_news", "Get the latest news headlines on a topic.", [A("topic", "The news topic", "string", "news_topic")],
      ["get me the latest news about {topic}", "show me today's headlines on {topic}",
       "brief me on the news about {topic}"], "info", "the headlines"),
    S("trade_stock", "Buy or sell shares of a stock.",
      [A("stock", "The company or ticker", "string"), A("action", "buy or sell", "string", "trade_action")],
      ["place an order to {action} {stock} shares", "put in an order to {action} shares of {stock}",
       "go ahead and {action} some {stock} stock in my brokerage account"]),
    S("search_flights", "Search flights between two cities on a date.",
      [A("origin", "The departure city", "string", "city"), A("destination", "The arrival city", "string", "city"),
       A("date", "The travel date", "date")],
      ["search for flights from {origin} to {destination} on {date}",
       "find flights from {origin} to {destination} for {date}",
       "check which flights go from {origin} to {destination} on {date}"], "flights", "the flight options"),
    S("book_flight", "Book a seat on a flight.",
      [A("flight", "The flight number", "string", "flight", accepts=("flights",))],
      ["book {flight}", "reserve a seat on {flight}", "get me a ticket for {flight}"],
      refs={"flight": ("one of those flights", "the best of the flight options")}),
    S("book_hotel", "Reserve a hotel room for a night.",
      [A("hotel", "The hotel", "string"), A("date", "The night of the stay", "date")],
      ["book a room at {hotel} for {date}", "reserve {hotel} for the night of {date}",
       "get me a hotel room at {hotel} on {date}"]),
    S("book_restaurant", "Reserve a table at a restaurant.",
      [A("restaurant", "The restaurant", "string"), A("date", "The day of the booking", "date")],
      ["reserve a table at {restaurant} for {date}", "book dinner at {restaurant} on {date}",
       "make a dinner reservation at {restaurant} for {date}"]),
    S("rent_car", "Rent a car in a city from a date.",
      [A("city", "Where to pick up the car", "string"), A("date", "The pickup date", "date")],
      ["rent a car in {city} for {date}", "book a rental car in {city} on {date}",
       "arrange a car hire in {city} starting {date}"]),
    S("shop_online", "Buy a product from an online shop.",
      [A("product", "What to buy", "string"), A("website", "The shop", "string")],
      ["buy {product} on {website}", "purchase {product} from {website}",
       "add {product} to my cart on {website} and check out"]),
    S("send_email", "Send an email.",
      [A("email_address", "The recipient's email address", "email", "email"), CONTENT],
      ["email {content} to {email_address}", "send an email to {email_address} with {content}",
       "send {email_address} an email containing {content}"]),
    S("send_sms", "Send a text message to a phone number.",
      [A("phone_number", "The recipient's phone number", "phone", "phone"), CONTENT],
      ["text {content} to {phone_number}", "send a text message to {phone_number} with {content}",
       "send an SMS with {content} to {phone_number}"]),
    S("post_social", "Publish a post on a social network.",
      [CONTENT, A("network", "The social network", "string", "social_network")],
      ["post {content} on {network}", "share {content} on my {network} account",
       "publish {content} on {network}"]),
    S("check_balance", "Check the balance of a bank account.", [A("bank", "The bank", "string")],
      ["check my account balance at {bank}", "tell me how much money is in my {bank} account",
       "look up my {bank} balance"], "info", "the balance"),
    S("apply_job", "Apply for a job at a company.",
      [A("job", "The position", "string"), A("company", "The employer", "string", "employer")],
      ["apply for the {job} position at {company}", "submit a job application for {job} at {company}",
       "send my resume for the {job} role at {company}"]),
    S("see_doctor", "Book an online consultation with a doctor.",
      [A("symptom", "What the visit is about", "string"), A("doctor", "The doctor", "string")],
      ["book an online consultation with {doctor} about {symptom}",
       "set up a video visit with {doctor} for {symptom}",
       "get me an online appointment with {doctor} about {symptom}"]),
    S("consult_lawyer", "Get legal advice from a lawyer online.",
      [A("issue", "The legal issue", "string", "legal_issue"), A("lawyer", "The lawyer", "string")],
      ["get legal advice from {lawyer} about {issue}", "ask the lawyer {lawyer} for advice on {issue}",
       "talk to my attorney {lawyer} about {issue}"]),
    S("enroll_course", "Enroll in a course at a university.",
      [A("course", "The course", "string"), A("university", "The school", "string")],
      ["enroll me in {course} at {university}", "sign me up for the {course} course at {university}",
       "register me for {course} at {university}"]),
    S("buy_insurance", "Buy an insurance policy.",
      [A("insurance", "The kind of insurance", "string"), A("company", "The insurer", "string", "insurer")],
      ["buy {insurance} from {company}", "get a {insurance} policy with {company}",
       "sign me up for {insurance} through {company}"]),
    S("bank_transfer", "Transfer money to a person.",
      [A("amount", "How much", "money"), A("recipient", "Who receives it", "string", "person")],
      ["transfer {amount} to {recipient}", "send {amount} to {recipient} from my bank account",
       "wire {amount} to {recipient}"]),
    S("pay_bill", "Pay a household bill.",
      [A("bill", "Which bill", "string"), A("amount", "How much", "money")],
      ["pay my {bill} bill of {amount}", "settle the {amount} {bill} bill",
       "take care of my {bill} bill, it's {amount}"]),
    S("sell_item", "List an item for sale online.",
      [A("item", "What to sell", "string"), A("website", "Where to sell it", "string", "resale_site")],
      ["sell my {item} on {website}", "list my {item} for sale on {website}",
       "put my {item} up for sale on {website}"]),
    S("file_taxes", "File the tax return for a year.", [A("year", "The tax year", "string")],
      ["file my {year} tax return", "do my taxes for {year}", "submit my tax return for {year}"]),
    S("apply_passport", "Apply for a passport.", [A("country", "The issuing country", "string")],
      ["apply for a passport from {country}", "start a passport application for {country}",
       "request a new passport from {country}"]),
    S("pay_credit_card", "Make a payment on a credit card.",
      [A("card", "The credit card", "string"), A("amount", "How much", "money")],
      ["pay {amount} toward my {card} card", "make a {amount} payment on my {card} credit card",
       "put {amount} toward the {card} credit card"]),
    S("robot_chore", "Have the home robot do a chore.", [A("chore", "The chore", "string")],
      ["have the robot {chore}", "tell the cleaning robot to {chore}", "get the home robot to {chore}"]),
    S("add_event", "Add an event to the calendar.",
      [A("title", "The event", "string", "event_title"), A("date", "The day", "date")],
      ["add {title} to my calendar on {date}", "put {title} in my calendar for {date}",
       "create a calendar entry called {title} on {date}"]),
    S("ship_package", "Ship a package to an address.",
      [A("package", "What to ship", "string"), A("destination", "The address", "string", "address")],
      ["ship {package} to {destination}", "send {package} by courier to {destination}",
       "arrange delivery of {package} to {destination}"]),
    S("order_food", "Order food for delivery.",
      [A("food", "What to eat", "string"), A("platform", "The delivery app", "string", "food_app")],
      ["get {food} delivered via {platform}", "order {food} for delivery on {platform}",
       "have {food} delivered through {platform}"]),
    S("call_taxi", "Call a taxi to a place.",
      [A("destination", "Where to go", "string", "place"), A("platform", "The ride app", "string", "ride_app")],
      ["get me a ride to {destination} with {platform}", "call a taxi to {destination} through {platform}",
       "order a cab to {destination} on {platform}"]),
    S("play_music", "Play a song.", [A("title", "The song", "string", "song")],
      ["play the song {title}", "put on the track {title}", "start the music {title} on the speaker"]),
    S("play_movie", "Play a movie.", [A("title", "The movie", "string", "movie")],
      ["play the movie {title}", "stream the film {title} on the TV", "put on the movie {title}"]),
    S("take_note", "Save a note.", [CONTENT],
      ["take a note saying {content}", "jot down {content} in my notes", "save {content} as a note"],
      refs={"content": ("{noun}",)}),
    S("borrow_book", "Borrow a book from a library online.",
      [A("book", "The book", "string"), A("library", "The library", "string")],
      ["borrow {book} from {library}", "check out the book {book} from {library} online",
       "reserve the book {book} at {library}"]),
    S("video_call", "Start a video call.", [A("phone_number", "Who to call", "phone", "phone")],
      ["start a video call with {phone_number}", "video call {phone_number}",
       "set up a video chat with {phone_number}"]),
    S("voice_call", "Make a phone call.", [A("phone_number", "Who to call", "phone", "phone")],
      ["call {phone_number}", "give {phone_number} a ring", "place a voice call to {phone_number}"]),
    S("schedule_meeting", "Schedule an online meeting.",
      [A("topic", "The agenda", "string", "meeting_topic"), A("date", "The day", "date")],
      ["schedule an online meeting about {topic} on {date}", "set up a video meeting on {topic} for {date}",
       "organize a virtual meeting about {topic} for {date}"]),
    S("join_meeting", "Join an online meeting.", [A("topic", "The meeting's topic", "string", "meeting_topic")],
      ["join the online meeting about {topic}", "connect me to the meeting on {topic}",
       "log me into the meeting about {topic}"]),
    S("manage_software", "Install, uninstall or update software.",
      [A("software", "The program", "string"),
       A("action", "install, uninstall or update", "string", "software_action")],
      ["use the software manager to {action} {software}", "open the software center and {action} {software}",
       "make sure to {action} {software} on my computer"]),
    S("print_document", "Print a document.", [A("document", "The file to print", "document")],
      ["print {document}", "send {document} to the printer", "make a hard copy of {document}"]),
    S("set_alarm", "Set an alarm.", [A("time", "When to ring", "time")],
      ["set an alarm for {time}", "wake me up at {time}", "set my alarm to {time}"]),
))

LANGUAGE_SPEECH = FamilyDef("t2_language_speech", "t2", "Language & Speech", (
    S("transcribe", "Transcribe the speech in a recording.", [A("audio", "The recording")],
      ["transcribe {audio}", "write out the words spoken in {audio}", "convert the speech in {audio} to text",
       "send me a transcript of {audio}"], "text", "the transcript"),
    S("text_to_speech", "Read text aloud as audio.", [A("text", "The text to speak")],
      ["read {text} aloud", "turn {text} into speech", "convert {text} into a spoken audio file"],
      "audio", "the spoken version"),
    S("translate", "Translate text into another language.",
      [A("text", "The text"), A("language", "The target language", "string")],
      ["translate {text} into {language}", "put {text} into {language}", "render {text} in {language}"],
      "text", "the translation"),
    S("detect_language", "Identify the language a text is written in.", [A("text", "The text")],
      ["identify which language {text} is written in", "detect the language of {text}",
       "tell me what language {text} is in"], "label", "the detected language"),
    S("correct_grammar", "Fix grammar and spelling.", [A("text", "The text")],
      ["fix the grammar in {text}", "proofread {text}", "correct the spelling and grammar of {text}"],
      "text", "the corrected text"),
    S("paraphrase", "Say the same thing in other words.", [A("text", "The text")],
      ["paraphrase {text}", "rephrase {text} in different words", "reword {text}"], "text", "the paraphrase"),
    S("simplify_text", "Rewrite text in plain language.", [A("text", "The text")],
      ["simplify {text}", "rewrite {text} in plain language", "make {text} easier to understand"],
      "text", "the simplified version"),
    S("denoise_audio", "Remove background noise from audio.", [A("audio", "The recording")],
      ["remove the background noise from {audio}", "clean up the noise in {audio}", "denoise {audio}"],
      "audio", "the cleaned audio"),
    S("change_voice", "Change the voice in a recording.",
      [A("audio", "The recording"), A("voice", "The new voice", "string")],
      ["make {audio} sound like a {voice} voice", "change the voice in {audio} to a {voice} voice",
       "apply a {voice} voice filter to {audio}"], "audio", "the voice-changed audio"),
    S("splice_audio", "Join two recordings into one.",
      [A("audio", "The first recording"), A("second_audio", "The recording to append", "audio", "audio")],
      ["join {audio} and {second_audio} into one track", "splice {audio} together with {second_audio}",
       "append {second_audio} to the end of {audio}"], "audio", "the combined recording"),
    S("classify_audio", "Classify the kind of sound in a recording.", [A("audio", "The recording")],
      ["classify the sounds in {audio}", "tell me what kind of sound {audio} contains",
       "identify the type of audio in {audio}"], "label", "the sound label"),
))

RETRIEVAL_UNDERSTANDING = FamilyDef("t3_retrieval_understanding", "t3", "Retrieval & Understanding", (
    S("web_search", "Search the web.", [A("query", "What to search for", "text", "query")],
      ["search the web for {query}", "run a web search for {query}", "find information about {query}"],
      "text", "the search results"),
    S("image_search", "Find images matching a description.", [A("query", "What to look for", "text", "visual_query")],
      ["find an image of {query}", "search for pictures of {query}", "look up a photo of {query}"],
      "image", "the found image"),
    S("video_search", "Find videos matching a description.", [A("query", "What to look for", "text", "visual_query")],
      ["find a video about {query}", "search for videos of {query}", "look up a clip showing {query}"],
      "video", "the found video"),
    S("download_image", "Download an image from a URL.", [A("url", "The address", pool="image_url")],
      ["download the image at {url}", "save the picture from {url}", "grab the image from {url}"],
      "image", "the downloaded image",
      refs={"url": ("{noun}", "that link")}),
    S("download_video", "Download a video from a URL.", [A("url", "The address", pool="video_url")],
      ["download the video at {url}", "save the video from {url}", "grab the clip from {url}"],
      "video", "the downloaded video",
      refs={"url": ("{noun}", "that link")}),
    S("download_audio", "Download an audio file from a URL.", [A("url", "The address", pool="audio_url")],
      ["download the audio at {url}", "save the sound file from {url}", "grab the audio track from {url}"],
      "audio", "the downloaded audio",
      refs={"url": ("{noun}", "that link")}),
    S("download_text", "Fetch the text of a web page.", [A("url", "The address", pool="page_url")],
      ["fetch the text of {url}", "download the article at {url}", "pull the text from {url}"],
      "text", "the page text",
      refs={"url": ("{noun}", "that link")}),
    S("extract_urls", "Extract the web address mentioned in a text.", [A("text", "The text", pool="text_with_url")],
      ["pull out the link from {text}", "extract the URL mentioned in {text}", "find the web address in {text}"],
      "url", "the extracted link"),
    S("summarize", "Summarize a text.", [A("text", "The text")],
      ["summarize {text}", "give me a short summary of {text}", "condense {text} into a sentence or two"],
      "text", "the summary"),
    S("answer_question", "Answer a question from a text.",
      [A("text", "The context"), A("question", "The question", "text", "text_question", accepts=())],
      ["answer {question} using {text}", "based on {text}, answer {question}", "read {text} and tell me {question}"],
      "text", "the answer"),
    S("analyze_sentiment", "Tell whether a text is positive or negative.", [A("text", "The text")],
      ["analyze the sentiment of {text}", "tell me whether {text} sounds positive or negative",
       "check the tone of {text}"], "label", "the sentiment"),
    S("extract_keywords", "List the key terms of a text.", [A("text", "The text")],
      ["extract the keywords from {text}", "list the key terms in {text}", "pick out the main keywords of {text}"],
      "text", "the keywords"),
    S("extract_entities", "Find the people, places and organisations in a text.", [A("text", "The text")],
      ["find the names of people and places in {text}", "extract the named entities from {text}",
       "tag the entities mentioned in {text}"], "text", "the named entities"),
    S("compare_texts", "Measure how similar two texts are.",
      [A("text", "The first text"), A("other_text", "The second text", "text", "text")],
      ["compare {text} with {other_text}", "tell me how similar {text} is to {other_text}",
       "measure the similarity between {text} and {other_text}"], "label", "the similarity score"),
    S("suggest_topics", "Suggest related topics for a text.", [A("text", "The text")],
      ["suggest related topics for {text}", "come up with discussion topics based on {text}",
       "propose follow-up topics from {text}"], "text", "the topic ideas"),
    S("classify_image", "Classify an image into a category.", [A("image", "The image")],
      ["classify {image}", "tell me what category {image} belongs to", "assign a category label to {image}"],
      "label", "the image category"),
    S("detect_objects", "Detect the objects in an image.", [A("image", "The image")],
      ["detect the objects in {image}", "list the objects visible in {image}", "locate every object in {image}"],
      "text", "the detected objects"),
    S("find_similar_images", "Find images that look like a given one.", [A("image", "The example image")],
      ["find images similar to {image}", "search for pictures that look like {image}",
       "do a reverse image search with {image}"], "image", "the similar image"),
    S("caption_video", "Describe what happens in a video.", [A("video", "The video")],
      ["describe what happens in {video}", "summarize the events in {video}", "write a description of {video}"],
      "text", "the video description"),
    S("chat_reply", "Reply conversationally to a message.", [A("text", "The message")],
      ["reply to {text}", "draft a friendly reply to {text}", "respond to {text} like a chatbot"],
      "text", "the reply"),
    S("recognize_song", "Identify the song playing in a recording.", [A("audio", "The recording")],
      ["identify the song playing in {audio}", "tell me which song is in {audio}", "recognize the music in {audio}"],
      "label", "the song name"),
))

VISION_DOCUMENT = FamilyDef("t4_vision_document", "t4", "Vision & Document", (
    S("caption_image", "Write a one-sentence caption for an image.", [A("image", "The image")],
      ["write a caption for {image}", "describe {image} in one sentence", "caption {image}",
       "give me a one-line summary of {image}"],
      "text", "the caption"),
    S("read_image_text", "Read the printed text in an image (OCR).", [A("image", "The image")],
      ["read the text in {image}", "extract the printed words from {image}", "run OCR on {image}"],
      "text", "the extracted text"),
    S("ask_image", "Answer a question about an image.",
      [A("image", "The image"), A("question", "The question", "text", "image_question", accepts=())],
      ["look at {image} and answer {question}", "answer {question} about {image}",
       "check {image} and tell me {question}"],
      "text", "the visual answer"),
    S("ask_document", "Answer a question about a document.",
      [A("document", "The document"), A("question", "The question", "text", "document_question", accepts=())],
      ["look up {question} in {document}", "find the answer to {question} in the document {document}",
       "read {document} and answer {question}"], "text", "the document answer"),
    S("segment_image", "Segment an image into regions.", [A("image", "The image")],
      ["segment {image}", "separate the objects in {image} into regions", "create a segmentation mask for {image}"],
      "image", "the segmentation mask"),
    S("estimate_depth", "Estimate the depth of each pixel.", [A("image", "The image")],
      ["estimate the depth in {image}", "make a depth map of {image}", "work out how far away things are in {image}"],
      "image", "the depth map"),
    S("colorize_image", "Add color to a grayscale image.", [A("image", "The image")],
      ["colorize {image}", "add color to {image}", "restore the colors of {image}"], "image", "the colorized image"),
    S("stitch_images", "Stitch two images into a panorama.",
      [A("image", "The left image"), A("second_image", "The right image", "image", "image")],
      ["stitch {image} and {second_image} into a panorama", "combine {image} with {second_image} side by side",
       "merge {image} and {second_image} into one wide picture"], "image", "the panorama"),
    S("extract_frame", "Grab a still frame from a video.", [A("video", "The video")],
      ["grab a still frame from {video}", "extract a frame from {video}", "take a snapshot image from {video}"],
      "image", "the still frame"),
))

GENERATION_EDITING = FamilyDef("t5_generation_editing", "t5", "Generation & Editing", (
    S("generate_image", "Generate an image from a description.", [A("prompt", "The description", "text", "prompt")],
      ["generate an image of {prompt}", "draw {prompt}", "create a picture showing {prompt}"],
      "image", "the generated image"),
    S("generate_video", "Generate a short video from a description.",
      [A("prompt", "The description", "text", "prompt")],
      ["generate a video of {prompt}", "make a short animation of {prompt}", "create a clip showing {prompt}"],
      "video", "the generated video"),
    S("generate_audio", "Generate a sound from a description.",
      [A("prompt", "The sound to make", "text", "sound_prompt")],
      ["generate a sound effect of {prompt}", "create audio of {prompt}", "synthesize the sound of {prompt}"],
      "audio", "the generated sound"),
    S("write_text", "Write a piece of text from a brief.",
      [A("prompt", "What to write", "text", "writing_prompt", accepts=())],
      ["write {prompt}", "draft {prompt} for me", "compose {prompt}"], "text", "the draft"),
    S("expand_text", "Expand a text with more detail.", [A("text", "The text")],
      ["expand {text} into a full paragraph", "elaborate on {text}", "flesh out {text} with more detail"],
      "text", "the expanded text"),
    S("spin_article", "Rewrite a text as a new, original article.", [A("text", "The text")],
      ["spin {text} into a unique article", "generate a new article from {text}",
       "rewrite {text} as an original article"], "text", "the new article"),
    S("edit_image", "Edit an image following an instruction.",
      [A("image", "The image"), A("instruction", "The edit", "string", "edit_instruction")],
      ["edit {image} to {instruction}", "modify {image} and {instruction}", "adjust {image} to {instruction}"],
      "image", "the edited image"),
    S("transfer_style", "Apply the style of one image to another.",
      [A("image", "The content image"), A("style_image", "The style reference", "image", "image")],
      ["apply the style of {style_image} to {image}", "restyle {image} to look like {style_image}",
       "transfer the artistic style from {style_image} onto {image}"], "image", "the stylized image"),
    S("upscale_image", "Increase the resolution of an image.", [A("image", "The image")],
      ["upscale {image}", "increase the resolution of {image}", "enlarge {image} without losing quality"],
      "image", "the upscaled image"),
    S("images_to_video", "Make a video from two images.",
      [A("image", "The first image"), A("second_image", "The second image", "image", "image")],
      ["make a slideshow video from {image} and {second_image}", "turn {image} and {second_image} into a video",
       "animate a transition from {image} to {second_image}"], "video", "the slideshow"),
    S("audio_to_image", "Create an image that visualizes a sound.", [A("audio", "The recording")],
      ["create an image that visualizes {audio}", "turn {audio} into artwork", "draw a picture inspired by {audio}"],
      "image", "the visualization"),
    S("add_audio_effect", "Add an audio effect to a recording.",
      [A("audio", "The recording"), A("effect", "The effect", "string")],
      ["add {effect} to {audio}", "apply a {effect} effect to {audio}", "put some {effect} on {audio}"],
      "audio", "the processed audio"),
    S("extract_audio", "Extract the audio track of a video.", [A("video", "The video")],
      ["extract the audio from {video}", "rip the soundtrack out of {video}", "pull the audio track from {video}"],
      "audio", "the soundtrack"),
    S("stabilize_video", "Remove camera shake from a video.", [A("video", "The video")],
      ["stabilize {video}", "remove the camera shake from {video}", "smooth out the shaky footage in {video}"],
      "video", "the stabilized video"),
    S("change_video_speed", "Change the playback speed of a video.",
      [A("video", "The video"), A("speed", "The new speed", "string")],
      ["change the playback speed of {video} to {speed}", "set {video} to play at {speed} speed",
       "retime {video} to {speed}"], "video", "the retimed video"),
    S("sync_video_audio", "Synchronize an audio track with a video.",
      [A("video", "The video"), A("audio", "The audio track")],
      ["sync {audio} with {video}", "align {audio} to {video}", "line up {audio} with the footage in {video}"],
      "video", "the synced video"),
    S("add_voiceover", "Add a spoken voiceover to a video.",
      [A("video", "The video"), A("script", "What the narrator says", "text", "text")],
      ["add a voiceover saying {script} to {video}", "narrate {video} with {script}",
       "dub {video} with {script} as narration"], "video", "the narrated video"),
    S("remove_background", "Cut out the subject of an image.", [A("image", "The image")],
      ["remove the background from {image}", "cut out the subject of {image}",
       "make the background of {image} transparent"], "image", "the cutout"),
    S("add_subtitles", "Burn subtitles into a video.",
      [A("video", "The video"), A("text", "The subtitle text")],
      ["add subtitles reading {text} to {video}", "burn {text} into {video} as captions",
       "overlay {text} on {video} as subtitles"], "video", "the subtitled video"),
))

FAMILIES: tuple[FamilyDef, ...] = (DAILY_LIFE, LANGUAGE_SPEECH, RETRIEVAL_UNDERSTANDING, VISION_DOCUMENT,
                                   GENERATION_EDITING)

# -- request phrasing ---------------------------------------------------------------------------

# "{s}" is the composed clause list (base-form verb phrases); "{S}" the same, capitalised.
WRAPPERS = ("Please {s}.", "Could you {s}?", "Can you {s}?", "Would you {s}?", "I need you to {s}.",
            "I'd like you to {s}.", "Help me {s}.", "{S}.", "{S}, please.", "Go ahead and {s}.",
            "Could you please {s}?", "Quick favor: {s}.", "When you get a chance, {s}.", "I want you to {s}.")

# A sequential connective states a dependency on the clause just before it; an independent one
# states none. Daily-life "then" is a task link; in media families "then" comes with a reference.
SEQUENTIAL = (", then ", " and then ", ", after that ", ", and once that's done, ", ", and afterwards ",
              ", and when that's finished, ")
INDEPENDENT = (", and also ", ", and separately ", ", and in addition ", ", plus ", ", and on top of that ",
               ", and independently ")

# Context sentences shared by every family: they carry other families' words on purpose.
CONTEXTS = (
    "I'm on my way to the airport.", "My phone is almost out of battery.", "I just got back from a photo shoot.",
    "We recorded a podcast episode last night.", "My manager wants a summary before noon.",
    "The image on my screen keeps freezing.", "I'm putting together a presentation for tomorrow.",
    "I have a video call in ten minutes.", "I'm working from a hotel this week.",
    "My sister sent me a bunch of files.", "I'm trying to clean up my inbox.",
    "The audio in our last meeting was terrible.", "I'm planning a trip to Lisbon next month.",
    "I'm preparing a report for my team.", "I'm writing a blog post about travel.",
    "It's been a busy day at the office.", "I'm helping my dad with his computer.",
    "I'm editing some footage for my channel.", "My friend just texted me a link.",
    "I need this done before the weekend.", "I'm studying for an exam on Friday.",
    "We are launching a new product next week.", "I'm organizing a birthday party.",
    "I'm sorting through old family photos.", "I'm learning Spanish at the moment.",
    "I'm at a coffee shop with slow wifi.", "Our team is translating the website.",
    "I'm moving to a new apartment soon.", "I'm catching a train in an hour.",
    "The client sent over a document this morning.", "I'm drafting an email to my landlord.",
    "I just downloaded a new app.", "My daughter made a short film for school.",
    "I want to share some news with my followers.", "The printer in our office is broken again.",
    "I'm cooking dinner and my hands are busy.", "I'm going through the notes from class.",
    "Someone sent me a voice message I can't play.", "I'm making a scrapbook of our holiday.",
    "My bank sent me a text about my account.",
)
CLOSERS = ("Thanks!", "Thank you.", "Thanks in advance.", "Much appreciated.", "No rush.", "It's for work.",
           "I'd appreciate it.", "That would help a lot.")
