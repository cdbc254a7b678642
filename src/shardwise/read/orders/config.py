"""A reader config that names an order (``shuffle``) and holds that order's own options
(``order``): the one mapping between a reader's keyword arguments, its state and the
order's :class:`~shardwise.read.orders.base.OrderOptions`.

A user passes an order's options by name beside the reader's other arguments; the config
takes them into ``order`` (an option of another order is refused, naming it), and its
state holds them flat, beside the fields, only for the order that reads them::

    TokenDataset(cache, seq_len=16, shuffle="block", block_size=4)
        config.order == BlockOptions(block_size=4, blocks_per_group=8)
        state: {..., "shuffle": "block", "block_size": 4, "blocks_per_group": 8}
    TokenDataset(cache, seq_len=16)              state: {..., "shuffle": "window"}

A read config written before an order owned its options holds ``block_size=64,
blocks_per_group=8`` whatever its order (:data:`~shardwise.checkpoint.RETIRED`): at those
values they are taken as the no-ops they were; at others, refused as any option of
another order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from shardwise.checkpoint import RETIRED
from shardwise.errors import ConfigError
from shardwise.read.orders.base import (
    ORDERS,
    OrderOptions,
    option_names,
    order_class,
    order_options,
)
from shardwise.read.reader_config import ReaderConfig, plain

C = TypeVar("C", bound="OrderedConfig")


class OrderedConfig(ReaderConfig):
    """Base of the configs with a ``shuffle`` (an order's name) and ``order`` (its options,
    None: the defaults) field; a subclass calls :meth:`check_order` in ``__post_init__``
    and may parse ``shuffle`` (:meth:`order_name`)."""

    shuffle: Any
    order: OrderOptions | None

    @classmethod
    def order_name(cls, shuffle: Any) -> str:
        """The registered order a ``shuffle`` value names."""
        return str(getattr(shuffle, "value", shuffle))

    def check_order(self) -> None:
        """Fill ``order`` with the order's defaults, or refuse options of another order."""
        name = self.order_name(self.shuffle)
        want = order_class(name).Options
        if self.order is None:
            object.__setattr__(self, "order", want())
        elif type(self.order) is not want:
            raise ConfigError(f"{self.reader}: shuffle={name!r} takes {want.__name__} "
                              f"options, got {self.order!r}")

    @classmethod
    def of(cls: type[C], config: C | None, options: Mapping[str, Any]) -> C:
        """As :meth:`ReaderConfig.of`; the order's options are taken by their names."""
        if config is not None and not isinstance(config, cls):
            return super().of(config, options)  # type: ignore[misc]  # refused there
        shuffle = options.get("shuffle", config.shuffle if config is not None else
                              cls.__dataclass_fields__["shuffle"].default)  # type: ignore[attr-defined]
        name = cls.order_name(shuffle)
        same = config is not None and cls.order_name(config.shuffle) == name
        kept = config.options_of_order() if same and config is not None else {}
        mine = option_names(order_class(name).Options)
        given = {k: v for k, v in options.items()  # what a config written before held
                 if k in mine or k not in RETIRED or v != RETIRED[k]}
        order, rest = order_options(name, {**kept, **given}, cls.reader)
        if "order" not in options:
            rest["order"] = order
        return super().of(config, rest)  # type: ignore[misc]

    @classmethod
    def argument_names(cls) -> set[str]:
        """The fields but ``order``, and every registered order's options (one of another
        order than ``shuffle``'s is refused by :meth:`of`, naming its order)."""
        orders = {n for c in ORDERS.values() for n in option_names(c.Options)}
        return (super().argument_names() - {"order"}) | orders

    def options_of_order(self) -> dict[str, Any]:
        """The order's own options, by name (plain JSON)."""
        return {k: plain(v) for k, v in (self.order.state() if self.order else {}).items()}

    def state(self) -> dict[str, Any]:
        out = super().state()
        del out["order"]
        return {**out, **self.options_of_order()}

    def options(self) -> dict[str, Any]:
        out = super().options()
        del out["order"]
        return {**out, **self.options_of_order()}

    @classmethod
    def from_state(cls, config: Mapping[str, Any]) -> dict[str, Any]:
        """The fields, and the options the state's order reads (a key it does not read, as
        every TokenDataset state held ``block_size`` before the block order owned it, is
        left out: :data:`~shardwise.checkpoint.RETIRED`)."""
        out = super().from_state(config)
        shuffle = config.get("shuffle", cls.__dataclass_fields__["shuffle"].default)  # type: ignore[attr-defined]
        mine = option_names(order_class(cls.order_name(shuffle)).Options)
        return {**out, **{k: config[k] for k in mine if k in config}}


__all__ = ["OrderedConfig"]
