"""`substreams acls`: the least-privilege ACLs of a role, printed or created."""

from __future__ import annotations

import click

from substreams.cli.options import bootstrap_option, config_option
from substreams.config import load_config
from substreams.kafka import acls as rules
from substreams.kafka import client


@click.command("acls")
@config_option
@bootstrap_option
@click.option("--role", type=click.Choice(rules.ROLES), required=True,
              help="What the principal runs (see the README, \"Production Kafka\").")
@click.option("--principal", required=True, metavar="User:NAME",
              help="The Kafka principal the role's processes log in as.")
@click.option("--stream", "streams", multiple=True, metavar="NAME",
              help="publisher/spark: a data stream it writes (repeat; default: all).")
@click.option("--apply", "apply_", is_flag=True,
              help="Create the ACLs (as the config's kafka.security user, who must be "
              "allowed to alter ACLs) instead of only printing them.")
def command(config_path: str, bootstrap: str | None, role: str, principal: str,
            streams: tuple[str, ...], apply_: bool) -> None:
    """Print (or --apply) exactly the ACLs ROLE needs under the config: a publisher writes
    its data topics, the acks and dead-letter topics with its transactional ids; only the
    acker writes control and checkpoint topics; a reader reads."""
    config = load_config(config_path)
    principal = rules.check_principal(principal)
    wanted = rules.role_acls(config, role, streams)
    for acl in wanted:
        click.echo(acl.line(principal))
    if not apply_:
        return
    server = client.resolve_bootstrap(config, bootstrap)
    rules.apply_acls(client.admin(server, config), principal, wanted)
    click.echo(f"{len(wanted)} ACLs for {principal} ({role}) created on {server}")
