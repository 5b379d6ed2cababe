"""Controllers: heuristics (EQ, static, CoPart, Ubik, CoCo, oracle), the learned-policy
runtime, and the versioned feature encoder shared by envs/ and tuner/."""
