from typing import Any, Dict, Optional

Failure = Optional[str]
CARRIED: Dict[str, type]
MESSAGE_LIMIT: int

def record(e: BaseException) -> str: ...
def rebuild(rank: int, failure: Any) -> BaseException: ...
