import kiln
import kiln.nn.functional as F

k1, k2, k3 = kiln.random.split(kiln.random.key(0), 3)
params = {"w": kiln.random.normal(k1, (10, 784)) * 0.01, "b": kiln.zeros((10,))}
x, y = kiln.random.normal(k2, (64, 784)), kiln.random.randint(k3, (64,), 0, 10)

def loss_fn(p, x, y):
    return F.cross_entropy(F.linear(x, p["w"], p["b"]), y)

@kiln.jit(donate_argnums=(0,))  # grad and the SGD update compiled into one program
def step(p, x, y):
    loss, g = kiln.value_and_grad(loss_fn)(p, x, y)
    return {k: p[k] - 0.1 * g[k] for k in p}, loss

for _ in range(100):
    params, loss = step(params, x, y)
print(f"loss after 100 steps: {loss.item():.4f}")
