import sys, time
from shmvec._bench import backends as B
from shmvec._bench.measures import Stepper, side_by_side
env = sys.argv[1]; n = int(sys.argv[2])
names = sys.argv[3].split(",")
st = {}
hs = []
for name in names:
    h = B.build(name, B.BuildSpec(env, n, 2, "fork")); h.reset(); hs.append(h)
    st[name] = Stepper(h.step, h.sample_actions(64), n)
r = side_by_side(st, 2.0, 10)
import numpy as np
for k, v in r.items(): print(k, int(np.median(v)), [int(x) for x in v])
for h in hs: h.close()
