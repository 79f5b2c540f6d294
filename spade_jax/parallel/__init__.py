"""Mesh construction, logical-axis rules and multi-host initialisation."""

from spade_jax.parallel.mesh import (MESH_AXES, RULE_SETS, MeshConfig,
                                     activation_sharding, batch_divisor,
                                     batch_sharding, constrain,
                                     initialize_distributed, logical_to_spec,
                                     make_mesh, tree_shardings)
