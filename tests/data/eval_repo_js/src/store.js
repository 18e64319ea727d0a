import { CartError } from "./errors.js";

export async function loadCart(db, userId) {
  const rows = await db.query("SELECT sku, price, quantity FROM cart WHERE user_id = $1", [userId]);
  if (!rows) {
    return [];
  }
  return rows.map((row) => ({ sku: row.sku, price: row.price, quantity: row.quantity }));
}

export async function saveItem(db, userId, item) {
  try {
    await db.query("INSERT INTO cart (user_id, sku) VALUES ($1, $2)", [userId, item.sku]);
  } catch (err) {
    console.error(err);
    throw new CartError(`cannot save ${item.sku}`);
  }
  await db.query("UPDATE carts SET touched = now() WHERE user_id = $1", [userId]);
}

export async function sync(client, userId, items) {
  const remote = await client.fetch(userId);
  const merged = new Map(remote.map((item) => [item.sku, item]));
  for (const item of items) {
    if (item.quantity === 0) {
      continue;
    }
    merged.set(item.sku, item);
  }
  await client.push(userId, [...merged.values()]);
  return merged.size;
}

export function label(sku, quantity, location) {
  if (quantity <= 0) {
    return `${sku}: out of stock`;
  }
  const text = `${sku}: ${quantity} in ${location}`;
  return location !== "main" ? `${text} (remote)` : text;
}
