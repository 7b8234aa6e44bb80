"""Writes tiered_memory/eval/data/bilingual.jsonl: the shipped memory-quality set.

Conversations of 20-60 turns in Chinese and English, in several domains (supplements, phones,
hotels, pharmacy, restaurants, insurance, courses, car rental, pets, flats). Each states products,
doses, prices, dates, names and preferences once, talks about other things for a while, and then
refers back to them by pronoun ("刚才那个产品", "the one you mentioned"). Probes: inline just before
each referring turn (>= 10 turns after the statement), reconnect at a point two thirds in, and end.

Deterministic (fixed seed): rerunning it rewrites the same file. Run from the repository root:

    .venv/bin/python scripts/make_bilingual.py
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tiered_memory.eval.dataset import Conversation, Probe, dump_jsonl, last_mention

OUT = Path(__file__).resolve().parent.parent / "tiered_memory" / "eval" / "data" / "bilingual.jsonl"


@dataclass(frozen=True)
class FactTurn:
    """A statement (`user`, `assistant`) carrying `evidence`, and the later turn that refers to it."""

    user: str
    assistant: str
    evidence: str
    ref_user: str
    ref_assistant: str


def pick(rng: random.Random, pool: list[str]) -> str:
    return rng.choice(pool)


# --- Chinese domains --------------------------------------------------------------------------


def zh_supplement(rng: random.Random) -> list[FactTurn]:
    product = pick(rng, ["活力健", "康源宁", "安心钙", "益生元宝", "清源胶囊", "元气素"])
    dose = pick(rng, ["每天2次，每次1粒", "每天早晚各2粒", "每天1次，每次3片", "一天三次，每次半袋"])
    price = pick(rng, ["398元", "268元", "599元", "158元"])
    age = pick(rng, ["68岁", "72岁", "59岁", "80岁"])
    avoid = pick(rng, ["不能吃含糖的", "对海鲜过敏", "胃不太好，怕刺激"])
    return [
        FactTurn(
            f"我想给我妈买点保健品，她今年{age}了。",
            f"好的，{age}的老人一般建议先从补钙和调理肠胃开始。",
            age,
            "对了，我刚才说我妈多大来着？你帮我记着点，挑的时候按她的年纪来。",
            f"您说阿姨今年{age}，我会按这个年纪来推荐。",
        ),
        FactTurn(
            "你们有什么推荐的吗？",
            f"可以看看我们的{product}，口碑一直不错。",
            product,
            "刚才你推荐的那个产品叫什么名字来着？",
            f"是{product}。",
        ),
        FactTurn(
            "这个怎么吃？",
            f"{dose}，饭后吃效果更好。",
            dose,
            "那个产品一天吃几次、一次吃多少来着？",
            f"{dose}，饭后吃。",
        ),
        FactTurn(
            "多少钱一盒？",
            f"一盒{price}，可以吃一个月。",
            price,
            "它一盒是多少钱来着？我再算一下。",
            f"一盒{price}。",
        ),
        FactTurn(
            f"另外她{avoid}，这个要紧吗？",
            "我记下了，挑产品时会避开不合适的成分。",
            avoid,
            "我前面说过我妈有什么忌讳的，你还记得吗？",
            f"您说阿姨{avoid}，我会避开。",
        ),
    ]


def zh_phone(rng: random.Random) -> list[FactTurn]:
    model = pick(rng, ["星辰X5", "华锐Mate 60", "小青Pro 14", "极光S9"])
    price = pick(rng, ["4299元", "3999元", "5499元", "2799元"])
    color = pick(rng, ["远峰蓝", "曜石黑", "雅川青", "珍珠白"])
    date = pick(rng, ["6月18日", "11月11日", "下周三", "9月20日"])
    name = pick(rng, ["李晓梅", "张伟", "陈思远", "刘芳"])
    return [
        FactTurn(
            "我想换个手机，预算五千以内，拍照要好。",
            f"可以看看{model}，拍照很强，夜景尤其好。",
            model,
            "你一开始推荐的那款手机是哪个型号？",
            f"是{model}。",
        ),
        FactTurn(
            "它现在卖多少钱？",
            f"官方价{price}，最近还有以旧换新补贴。",
            price,
            "那款手机的价格你再说一遍？",
            f"{price}。",
        ),
        FactTurn(
            f"我喜欢{color}，有这个颜色吗？",
            f"有的，{color}目前有货。",
            color,
            "我想要的是哪个颜色来着？别给我发错了。",
            f"您选的是{color}。",
        ),
        FactTurn(
            "什么时候能发货？",
            f"{date}统一发货，顺丰包邮。",
            date,
            "刚才说的发货时间是哪天？",
            f"{date}发货。",
        ),
        FactTurn(
            f"收货人写{name}就行。",
            f"好的，收货人登记为{name}。",
            name,
            "收货人我刚才报的是谁的名字？",
            f"收货人是{name}。",
        ),
    ]


def zh_hotel(rng: random.Random) -> list[FactTurn]:
    hotel = pick(rng, ["西湖畔酒店", "云栖山居", "海景假日酒店", "古城客栈"])
    date = pick(rng, ["10月3日", "5月1日", "8月15日", "12月24日"])
    price = pick(rng, ["每晚688元", "每晚450元", "每晚1280元", "每晚320元"])
    guest = pick(rng, ["王建国", "赵敏", "孙丽娟", "周杰"])
    pref = pick(rng, ["高楼层安静的房间", "无烟房", "带浴缸的房间", "靠近电梯的房间"])
    return [
        FactTurn(
            "我想订杭州的酒店，最好能看到湖景。",
            f"推荐{hotel}，步行就能到湖边，评价很好。",
            hotel,
            "你最开始推荐的那家酒店叫什么？",
            f"{hotel}。",
        ),
        FactTurn(
            f"我{date}入住，住两晚。",
            f"好的，{date}入住两晚，我帮您查一下房态。",
            date,
            "我入住是哪天来着？",
            f"您是{date}入住。",
        ),
        FactTurn(
            "房价多少？",
            f"湖景大床房{price}，含双早。",
            price,
            "那个房间多少钱一晚？",
            f"{price}，含双早。",
        ),
        FactTurn(
            f"入住人写{guest}。",
            f"好的，入住人{guest}。",
            guest,
            "入住人登记的是谁？",
            f"入住人是{guest}。",
        ),
        FactTurn(
            f"我比较喜欢{pref}。",
            "收到，我会备注给前台。",
            pref,
            "我刚才对房间提的要求是什么？",
            f"您希望要{pref}。",
        ),
    ]


def zh_pharmacy(rng: random.Random) -> list[FactTurn]:
    drug = pick(rng, ["布洛芬缓释胶囊", "阿莫西林胶囊", "氯雷他定片", "奥美拉唑肠溶片"])
    dose = pick(rng, ["每12小时1粒", "每天3次，每次2粒", "每天1片，睡前吃", "每天2次，饭前半小时"])
    days = pick(rng, ["连续吃5天", "吃7天", "吃3天", "最多吃10天"])
    allergy = pick(rng, ["青霉素过敏", "磺胺类过敏", "对阿司匹林过敏"])
    return [
        FactTurn(
            f"我{allergy}，现在有点发烧咳嗽。",
            "明白，我记下您的过敏情况，开药会避开。",
            allergy,
            "你还记得我对什么药过敏吗？",
            f"您{allergy}。",
        ),
        FactTurn(
            "那我吃什么药比较好？",
            f"可以先用{drug}。",
            drug,
            "你前面说的那个药叫什么？",
            f"{drug}。",
        ),
        FactTurn(
            "怎么吃？",
            f"{dose}，多喝水。",
            dose,
            "那个药的用法用量再说一下？",
            f"{dose}。",
        ),
        FactTurn(
            "要吃多久？",
            f"一般{days}，不见好要去医院。",
            days,
            "刚才说那药要吃几天？",
            f"{days}。",
        ),
    ]


def zh_restaurant(rng: random.Random) -> list[FactTurn]:
    place = pick(rng, ["蜀香园", "老北京涮肉坊", "江南小馆", "粤海茶餐厅"])
    people = pick(rng, ["8个人", "5位", "12个人", "两个人"])
    time = pick(rng, ["周六晚上六点半", "明天中午十二点", "周五晚七点", "下周日中午"])
    pref = pick(rng, ["不吃辣", "有人吃素", "不吃香菜", "要清淡一点"])
    phone = pick(rng, ["13812345678", "13987654321", "18600001111", "15011112222"])
    return [
        FactTurn(
            f"我们{people}聚餐，有推荐的餐厅吗？",
            f"可以去{place}，包间宽敞，适合聚会。",
            place,
            "你刚才推荐的那家餐厅叫什么？",
            f"{place}。",
        ),
        FactTurn(
            f"订{time}的。",
            f"好的，{time}，我给您预留包间。",
            time,
            "我们约的是什么时间？",
            f"{time}。",
        ),
        FactTurn(
            f"人数是{people}。",
            f"{people}，包间够坐。",
            people,
            "我们一共几个人来着？",
            f"{people}。",
        ),
        FactTurn(
            f"我们{pref}。",
            "好的，我会跟厨房备注口味。",
            pref,
            "口味上我提过什么要求？",
            f"您说{pref}。",
        ),
        FactTurn(
            f"联系电话是{phone}。",
            f"已登记联系电话{phone}。",
            phone,
            "我留的那个电话号码是多少？",
            f"{phone}。",
        ),
    ]


def zh_insurance(rng: random.Random) -> list[FactTurn]:
    plan = pick(rng, ["安康百万医疗险", "守护e生重疾险", "平安福终身寿险", "小康意外险"])
    premium = pick(rng, ["每年1280元", "每年3600元", "每月99元", "每年560元"])
    cover = pick(rng, ["保额50万", "保额100万", "最高赔付300万", "保额20万"])
    relation, name = rng.choice([("我爱人", "林静"), ("我儿子", "周小宇"), ("我父亲", "张国强"), ("我女儿", "李朵朵")])
    who = relation + name
    return [
        FactTurn(
            f"我想给{who}买份保险。",
            "好的，先了解一下被保险人的情况。",
            name,
            "被保险人我说的是谁来着？",
            f"是{who}。",
        ),
        FactTurn(
            "有什么合适的产品？",
            f"推荐{plan}，保障比较全面。",
            plan,
            "你推荐的那个险种叫什么名字？",
            f"{plan}。",
        ),
        FactTurn(
            "保费多少？",
            f"{premium}，可以按年交。",
            premium,
            "那个保险保费是多少来着？",
            f"{premium}。",
        ),
        FactTurn(
            "能保多少？",
            f"{cover}，住院和门诊都能报。",
            cover,
            "它的保额是多少？",
            f"{cover}。",
        ),
    ]


ZH_FILLER = [
    ("你们周末营业吗？", "周末正常营业，节假日另行通知。"),
    ("支持开发票吗？", "支持，可以开电子发票。"),
    ("能用微信支付吗？", "可以，微信和支付宝都支持。"),
    ("售后怎么联系？", "可以在小程序里找在线客服。"),
    ("有会员优惠吗？", "注册会员可以积分，积分能抵现。"),
    ("今天天气真热啊。", "是的，出门注意防暑。"),
    ("我再考虑一下。", "没问题，您慢慢考虑。"),
    ("你们门店在哪？", "市区有好几家门店，可以在地图上搜。"),
    ("可以退换吗？", "不影响二次销售的情况下可以退换。"),
    ("需要提前预约吗？", "建议提前预约，到店更方便。"),
    ("你们是正规的吗？", "我们有完整资质，可以放心。"),
    ("包装是什么样的？", "包装比较简洁，送人也体面。"),
    ("好的，我知道了。", "好的，有问题随时问我。"),
    ("我朋友也想了解一下。", "欢迎，可以让您朋友直接联系我。"),
    ("能不能再便宜点？", "价格是统一的，不过可以关注活动。"),
    ("有没有别的注意事项？", "注意保存环境，避免阳光直射。"),
    ("你们做多久了？", "我们做这行很多年了，老客户很多。"),
    ("怎么查物流？", "发货后会有短信通知，里面有查询链接。"),
    ("客服几点下班？", "在线客服晚上也有人值班。"),
    ("我先去忙了，等会儿再聊。", "好的，您先忙。"),
    ("你说的我都记下了。", "好的，有不清楚的再问我。"),
    ("这个季节适合出门吗？", "这个季节气候不错，挺适合的。"),
    ("你们有没有线上活动？", "经常有，关注公众号就能看到。"),
    ("刚才网有点卡。", "没关系，我们继续。"),
    ("能帮我比较一下吗？", "可以，您说说最看重哪一点。"),
    ("我家里人意见不太一样。", "可以商量一下，我这边随时配合。"),
    ("有没有什么赠品？", "活动期间会有小礼品。"),
    ("我之前没买过这类东西。", "没关系，我给您慢慢介绍。"),
]

ZH_DOMAINS = [zh_supplement, zh_phone, zh_hotel, zh_pharmacy, zh_restaurant, zh_insurance]


# --- English domains --------------------------------------------------------------------------


def en_supplement(rng: random.Random) -> list[FactTurn]:
    product = pick(rng, ["VitaBoost", "OmegaPure", "CalciMax", "ZenSleep"])
    dose = pick(rng, ["two capsules after breakfast", "one tablet twice a day", "three gummies at night"])
    price = pick(rng, ["$39.99", "$24.50", "$59", "$18.75"])
    age = pick(rng, ["74 years old", "81 years old", "66 years old"])
    return [
        FactTurn(
            f"I'm shopping for my father, he's {age}.",
            "Thanks, that helps me pick something gentle enough.",
            age,
            "Remind me, how old did I say my father is?",
            f"You said he is {age}.",
        ),
        FactTurn(
            "What would you recommend for his joints?",
            f"I'd suggest {product}, it's our best seller for joint support.",
            product,
            "What was the name of the one you recommended first?",
            f"That was {product}.",
        ),
        FactTurn(
            "How should he take it?",
            f"He should take {dose}.",
            dose,
            "How does he take that one again?",
            f"{dose[0].upper() + dose[1:]}.",
        ),
        FactTurn(
            "How much is a bottle?",
            f"A bottle is {price} and lasts a month.",
            price,
            "And what did that bottle cost again?",
            f"It's {price}.",
        ),
    ]


def en_laptop(rng: random.Random) -> list[FactTurn]:
    model = pick(rng, ["Zenbook Air 14", "ThinkPad X1 Nano", "Swift Go 16", "Aero 15 Pro"])
    price = pick(rng, ["$1,299", "$999", "$1,549", "$849"])
    date = pick(rng, ["March 14", "next Friday", "June 2", "October 21"])
    color = pick(rng, ["space gray", "midnight blue", "silver", "sage green"])
    name = pick(rng, ["Emily Carter", "Daniel Brooks", "Priya Natarajan", "Marco Rossi"])
    return [
        FactTurn(
            "I need a light laptop for travel, mostly writing and video calls.",
            f"The {model} would fit well: it's under a kilo and the battery lasts all day.",
            model,
            "Which model was the one you mentioned at the start?",
            f"The {model}.",
        ),
        FactTurn(
            "What does it cost?",
            f"It's {price} right now with the student discount.",
            price,
            "What was the price of that one again?",
            f"{price}.",
        ),
        FactTurn(
            f"I'd like it in {color} if possible.",
            f"Good news, {color} is in stock.",
            color,
            "Which colour did I ask for?",
            f"You asked for {color}.",
        ),
        FactTurn(
            "When would it arrive?",
            f"It would arrive on {date}.",
            date,
            "When did you say it arrives?",
            f"On {date}.",
        ),
        FactTurn(
            f"Please put the order under {name}.",
            f"Done, the order is under {name}.",
            name,
            "Whose name is the order under?",
            f"{name}.",
        ),
    ]


def en_travel(rng: random.Random) -> list[FactTurn]:
    hotel = pick(rng, ["Harbor View Inn", "The Linden Hotel", "Casa Azul", "Maple Lodge"])
    date = pick(rng, ["July 9", "August 23", "December 30", "April 5"])
    nightly = pick(rng, ["$189 a night", "$142 a night", "$260 a night"])
    seat = pick(rng, ["a window seat", "an aisle seat", "extra legroom"])
    flight = pick(rng, ["UA 857", "DL 1423", "BA 287", "LH 431"])
    return [
        FactTurn(
            "I'm planning a trip to Lisbon and need somewhere to stay.",
            f"The {hotel} is central and quiet, guests love it.",
            hotel,
            "What was that hotel you suggested?",
            f"The {hotel}.",
        ),
        FactTurn(
            f"I arrive on {date}.",
            f"Noted, checking in on {date}.",
            date,
            "Which day did I say I arrive?",
            f"{date}.",
        ),
        FactTurn(
            "How much is a double room?",
            f"A double is {nightly}, breakfast included.",
            nightly,
            "How much was the room per night?",
            f"{nightly}.",
        ),
        FactTurn(
            f"My flight is {flight}.",
            f"Got it, {flight}, I'll arrange the airport pickup.",
            flight,
            "What's my flight number again?",
            f"{flight}.",
        ),
        FactTurn(
            f"On the flight I prefer {seat}.",
            "I'll add that preference to your booking.",
            seat,
            "What seat did I say I prefer?",
            f"{seat[0].upper() + seat[1:]}.",
        ),
    ]


def en_pharmacy(rng: random.Random) -> list[FactTurn]:
    drug = pick(rng, ["amoxicillin", "loratadine", "omeprazole", "ibuprofen"])
    dose = pick(rng, ["500 mg every 8 hours", "10 mg once a day", "20 mg before breakfast"])
    allergy = pick(rng, ["allergic to penicillin", "allergic to sulfa drugs", "allergic to aspirin"])
    refill = pick(rng, ["May 3", "the 15th", "next Tuesday"])
    return [
        FactTurn(
            f"Before anything else, I'm {allergy}.",
            "Thank you, I've added that to your profile.",
            allergy,
            "Do you remember what I told you I'm allergic to?",
            f"You're {allergy}.",
        ),
        FactTurn(
            "The doctor prescribed something for my sinus infection.",
            f"Yes, it's {drug}.",
            drug,
            "What was the name of that medicine you mentioned?",
            f"{drug[0].upper() + drug[1:]}.",
        ),
        FactTurn(
            "How do I take it?",
            f"Take {dose} with water.",
            dose,
            "How much of it do I take, and how often?",
            f"{dose}.",
        ),
        FactTurn(
            "When can I get a refill?",
            f"Your refill will be ready on {refill}.",
            refill,
            "When did you say the refill is ready?",
            f"On {refill}.",
        ),
    ]


def en_restaurant(rng: random.Random) -> list[FactTurn]:
    place = pick(rng, ["Osteria Nonna", "Blue Lotus", "The Copper Pot", "Sakura House"])
    party = pick(rng, ["party of six", "table for four", "group of ten"])
    time = pick(rng, ["7:30 pm on Saturday", "noon on Sunday", "8 pm on Friday"])
    diet = pick(rng, ["vegetarian", "gluten-free", "nut allergy"])
    return [
        FactTurn(
            "Can you find us a place for my sister's birthday dinner?",
            f"How about {place}? They have a private room.",
            place,
            "What was the restaurant you suggested?",
            f"{place}.",
        ),
        FactTurn(
            f"We're a {party}.",
            f"A {party}, that works for their private room.",
            party,
            "How many people did I book for?",
            f"A {party}.",
        ),
        FactTurn(
            f"Let's do {time}.",
            f"Booked for {time}.",
            time,
            "What time is the booking?",
            f"{time}.",
        ),
        FactTurn(
            f"One guest is {diet}, please note that.",
            "Noted for the kitchen.",
            diet,
            "What dietary note did I ask you to add?",
            f"One guest is {diet}.",
        ),
    ]


EN_FILLER = [
    ("Do you ship internationally?", "We do, to most countries."),
    ("Is there a loyalty program?", "Yes, you earn points on every order."),
    ("Can I pay with a credit card?", "Of course, all major cards are accepted."),
    ("How do I contact support later?", "Through the chat on our website, any time."),
    ("It's been a long week.", "I hear you, let's make this part easy."),
    ("Let me think about it for a moment.", "Take your time."),
    ("Is this available in stores too?", "Yes, most of our stores carry it."),
    ("Can I cancel later if plans change?", "Yes, cancellation is free up to a day before."),
    ("Do I need to create an account?", "It helps, but guest checkout works too."),
    ("My friend recommended you.", "That's great to hear, thank them for us."),
    ("Is there anything else I should know?", "Just keep your confirmation email handy."),
    ("Sorry, my connection dropped.", "No problem, we can pick up where we left off."),
    ("Can you send me a summary by email?", "Sure, I'll send it once we're done."),
    ("How long have you been in business?", "For quite a few years now."),
    ("Do you have gift wrapping?", "We do, you can choose it at checkout."),
    ("Okay, that sounds good.", "Great, let me know what else you need."),
    ("What are your opening hours?", "We're open every day, including weekends."),
    ("Is the website secure?", "Yes, everything is encrypted."),
    ("My partner might have questions too.", "Happy to help them as well."),
    ("Could you compare the options for me?", "Sure, tell me what matters most to you."),
    ("I'll be travelling a lot next month.", "Good to know, I'll keep that in mind."),
    ("Thanks for being patient with me.", "Not at all, that's what I'm here for."),
]

EN_DOMAINS = [en_supplement, en_laptop, en_travel, en_pharmacy, en_restaurant]


def conversation(rng: random.Random, index: int, lang: str) -> Conversation:
    domains, filler = (ZH_DOMAINS, ZH_FILLER) if lang == "zh" else (EN_DOMAINS, EN_FILLER)
    facts = domains[index % len(domains)](rng)
    if rng.random() < 0.5:
        # Two errands in one conversation: twice the facts to keep apart.
        facts += domains[(index + 1 + rng.randrange(len(domains) - 1)) % len(domains)](rng)
    fillers = rng.sample(filler, len(filler))
    turns: list[tuple[str, str]] = []
    stated: dict[str, int] = {}

    def chat(n: int) -> None:
        for _ in range(n):
            turns.append(fillers[len(turns) % len(fillers)])

    for f in facts:
        turns.append((f.user, f.assistant))
        stated[f.evidence] = len(turns)
        chat(rng.randint(0, 2))
    chat(rng.randint(8, 14))
    refs: list[tuple[FactTurn, int]] = []
    order = rng.sample(facts, len(facts))
    for f in order:
        chat(max(0, stated[f.evidence] + 10 - len(turns)) + rng.randint(0, 3))
        turns.append((f.ref_user, f.ref_assistant))
        refs.append((f, len(turns)))
    chat(max(0, 20 - len(turns)) + rng.randint(0, 4))
    turns = turns[:60]
    n = len(turns)
    probes: list[Probe] = []
    for f, at in refs:
        if at > n:
            continue
        said = last_mention(turns, (f.evidence,), through=at - 1)
        if said and at - 1 - said >= 10:
            probes.append(Probe("inline", at - 1, (f.evidence,), said, f.ref_user))
    reconnect_at = max(r for _, r in refs[: max(1, 2 * len(refs) // 3)]) - 1
    for f in facts:
        said = last_mention(turns, (f.evidence,), through=reconnect_at)
        if said and reconnect_at - said >= 10:
            # The same question just before the restart: G2 compares the two.
            probes.append(Probe("inline", reconnect_at, (f.evidence,), said, f.ref_user))
            probes.append(Probe("reconnect", reconnect_at, (f.evidence,), said, f.ref_user))
        said = last_mention(turns, (f.evidence,), through=n)
        probes.append(Probe("end", n, (f.evidence,), said, f.ref_user))
    return Conversation(f"{lang}-{index:02d}", "bilingual", tuple(turns), tuple(probes))


def main() -> None:
    rng = random.Random(20261130)
    convs = [conversation(rng, i, lang) for lang in ("zh", "en") for i in range(12)]
    dump_jsonl(convs, OUT)
    turns = [len(c.turns) for c in convs]
    print(
        f"{OUT}: {len(convs)} conversations, {min(turns)}-{max(turns)} turns, "
        f"{sum(len(c.probes) for c in convs)} probes"
    )


if __name__ == "__main__":
    main()
