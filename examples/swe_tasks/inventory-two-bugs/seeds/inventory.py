"""A tiny stock keeper."""


class Inventory:
    def __init__(self) -> None:
        self._stock: dict[str, int] = {}
        self._prices: dict[str, float] = {}

    def add(self, sku: str, quantity: int, price: float) -> None:
        """Add ``quantity`` items of ``sku``, each worth ``price``."""
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self._stock[sku] = self._stock.get(sku, 0) + quantity
        self._prices[sku] = price

    def remove(self, sku: str, quantity: int) -> None:
        """Take ``quantity`` items of ``sku`` out of the stock."""
        self._stock[sku] = self._stock.get(sku, 0) - quantity

    def quantity(self, sku: str) -> int:
        return self._stock.get(sku, 0)

    def total_value(self) -> float:
        """What the whole stock is worth."""
        return sum(self._prices[sku] for sku in self._stock)
