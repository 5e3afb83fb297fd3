#!/usr/bin/python3
"""A fake desktop notification server on the session bus.

Owns org.freedesktop.Notifications and answers the Desktop Notifications
Specification's methods (Notify, GetCapabilities, GetServerInformation,
CloseNotification) at /org/freedesktop/Notifications. Every Notify call is
printed to stdout as one JSON line ({"app_name", "summary", "body", ...});
"ready" is printed once the name is owned. Needs Debian's python3-dbus and
python3-gi (the system Python: /usr/bin/python3).
"""

import json
import sys

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"


class Notifications(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, PATH)
        self.last_id = 0

    @dbus.service.method(NAME, in_signature="susssasa{sv}i", out_signature="u")
    def Notify(self, app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout):
        self.last_id += 1
        print(json.dumps({
            "id": self.last_id,
            "app_name": str(app_name),
            "summary": str(summary),
            "body": str(body),
            "actions": [str(a) for a in actions],
        }), flush=True)
        return dbus.UInt32(self.last_id)

    @dbus.service.method(NAME, in_signature="", out_signature="as")
    def GetCapabilities(self):
        return ["body", "actions"]

    @dbus.service.method(NAME, in_signature="", out_signature="ssss")
    def GetServerInformation(self):
        return ("lemon-e2e-notifications", "lemon", "1.0", "1.2")

    @dbus.service.method(NAME, in_signature="u", out_signature="")
    def CloseNotification(self, notification_id):
        self.NotificationClosed(notification_id, dbus.UInt32(3))

    @dbus.service.signal(NAME, signature="uu")
    def NotificationClosed(self, notification_id, reason):
        pass


def main():
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.SessionBus()
    name = dbus.service.BusName(NAME, bus, do_not_queue=True)
    service = Notifications(bus)
    print("ready", flush=True)
    try:
        GLib.MainLoop().run()
    except KeyboardInterrupt:
        pass
    del service, name
    return 0


if __name__ == "__main__":
    sys.exit(main())
