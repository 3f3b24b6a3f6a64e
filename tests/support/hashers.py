"""The tests' password hasher: Argon2id as in production, with small costs, because the suite
makes and signs in hundreds of people and production's costs (100 MiB, two passes) are
deliberately slow. Hashes still read `argon2$argon2id$...`."""

from django.contrib.auth.hashers import Argon2PasswordHasher


class QuickArgon2PasswordHasher(Argon2PasswordHasher):
    time_cost = 1
    memory_cost = 1024  # KiB
    parallelism = 1
