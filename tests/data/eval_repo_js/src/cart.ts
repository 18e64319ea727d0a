export interface Item {
  sku: string;
  price: number;
  quantity: number;
}

export class CartError extends Error {}

export function total(items: Item[], discount: number): number {
  let sum = 0;
  for (let i = 0; i < items.length; i++) {
    sum += items[i].price * items[i].quantity;
  }
  if (discount > 0) {
    sum = sum * (1 - discount / 100);
  }
  return Math.round(sum * 100) / 100;
}

export function find(items: Item[], sku: string): Item {
  const found = items.find((item) => item.sku === sku);
  if (found === undefined) {
    throw new CartError(`no item ${sku}`);
  }
  return found;
}

export function clamp(value: number, low: number, high: number): number {
  if (value < low) {
    return low;
  }
  if (value > high) {
    return high;
  }
  return value;
}
