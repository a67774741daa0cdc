# Role scenario, the role proven against a real cron: molecule/default applies roles/session_maintenance to localhost
# with a real cron for a generated `hermes` user, then checks idempotence, the crontab
# entry, modes, the cron command's --dry-run and real run, and state=absent. It installs
# cron and creates the user on THIS machine: meant for CI and throwaway machines.

.PHONY: molecule

molecule: $(STAMP) collection-link ## role test: molecule test -s default (localhost, real cron; changes this machine)
	$(ANSIBLE_ENV) $(BIN)/molecule test -s default
