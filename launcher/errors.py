"""The one error type of rrun: click prints it as a single 'Error: ...' line, exit status 2."""

import click


class LaunchError(click.ClickException):
    exit_code = 2
