"""A test user's Hermes home for the role tests that apply the role with privilege.

Plain Python 3.8+ standard library. Import with ``tests/lib`` on ``sys.path``::

    from hermes_role_host import RoleHost, role_host
"""

import contextlib
import os

from hermes_reliability import chown_tree, user_with_dir

from hermes_fixtures import build_home


class RoleHost:
    """The test user's Hermes home and own directory, and the role's variables for them."""

    def __init__(self, user, base, uid, gid):
        self.user, self.base, self.uid, self.gid = user, base, uid, gid
        self.home = base / "home"  # the user's home: cwd of root's runs, where files are planted
        self.hermes = self.home / ".hermes"
        self.data = self.home / ".local" / "share" / "hermes-ops"
        self.markers = base / "markers"

    def vars(self, **extra):
        return dict(
            {
                "hermes_maintenance_user": self.user,
                "hermes_maintenance_homes": [str(self.hermes)],
                "hermes_maintenance_install_dir": str(self.data),
                "hermes_maintenance_scheduler": "none",
                "hermes_maintenance_syslog": False,
                "hermes_maintenance_prune_days": 7,
            },
            **extra,
        )

    def as_user(self):
        uid, gid = self.uid, self.gid

        def switch():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        return {"preexec_fn": switch}


@contextlib.contextmanager
def role_host(host_class, user, specs, remove_everything, profiles=(None,), layout="v30"):
    """A ``host_class`` for ``user`` (created when absent) in a fresh directory, its home holding
    ``specs`` in each of ``profiles`` (state.db files of ``layout``, see hermes_fixtures);
    ``remove_everything`` (what the role installs) runs before and after."""
    with user_with_dir(user, user + "-") as (uid, gid, base):
        remove_everything()
        h = host_class(user, base, uid, gid)
        for profile in profiles:
            build_home(str(h.hermes), layout, specs, profile=profile)
        h.markers.mkdir()
        os.chmod(str(h.markers), 0o777)  # what runs as anyone (planted files, a replaced python) leaves its marker here
        chown_tree(h.home, uid, gid)
        os.chmod(str(h.home), 0o700)
        try:
            yield h
        finally:
            remove_everything()
