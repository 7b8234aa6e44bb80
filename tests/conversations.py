"""Self-made conversations for tests: early facts that later turns must still find in memory."""

from __future__ import annotations

# 12 turns. Turns 1-3 state the facts (product, dose, price, name, preference); the rest drift.
ZH_12_TURNS: list[tuple[str, str]] = [
    ("你好，我叫王小明，想了解一下活力健这个产品。", "您好王小明！活力健是一款复合维生素，适合日常营养补充。"),
    ("活力健怎么吃？", "活力健每天2次，每次1条，饭后服用效果更好。"),
    ("价格多少？我不喜欢太甜的口味。", "活力健一盒398元，有原味可选，不会太甜。"),
    ("今天天气怎么样？", "今天北京晴，气温18度左右。"),
    ("周末有什么好看的电影推荐吗？", "最近上映的科幻片口碑不错，可以去看看。"),
    ("我想去爬山，香山人多吗？", "周末香山游客较多，建议早上七点前出发。"),
    ("爬山要带什么？", "建议带水、防晒霜和一件薄外套。"),
    ("附近有好吃的餐厅吗？", "香山脚下有几家农家菜，口碑都还可以。"),
    ("农家菜一般人均多少钱？", "人均大约80元左右。"),
    ("晚上回来堵车吗？", "周末傍晚五环方向通常比较堵，建议错峰返回。"),
    ("好的，谢谢你的建议。", "不客气，祝您周末愉快！"),
    ("对了，刚才那个产品适合高血压的人吗？", "活力健一般人群都可以服用，高血压患者建议先咨询医生。"),
]

# Evidence from the first three turns that memory must keep.
ZH_EARLY_EVIDENCE = ["活力健", "398", "王小明"]

# 3 turns in English: the summarizer must answer in the conversation's language.
EN_3_TURNS: list[tuple[str, str]] = [
    ("Hi, I'm Alice and I'd like to know about the X200 earbuds.", "Hello Alice! The X200 are wireless earbuds."),
    ("How much do they cost?", "The X200 cost $129, in black or white."),
    ("I prefer something light. How heavy are they?", "Each earbud weighs 4.5 grams."),
]

# The user writes English, the assistant answers in (longer) Chinese: the user's language decides.
MIXED_3_TURNS: list[tuple[str, str]] = [
    ("Tell me about the X200 earbuds.", "X200是一款无线耳机，续航30小时，支持主动降噪和快速充电功能。"),
    ("Price?", "X200耳机售价129美元，有黑色和白色两种颜色可以选择。"),
    ("Weight?", "每只耳机重4.5克，是我们店里最轻的一款无线耳机之一。"),
]
