"""Create the demo's superuser admin/admin, or leave it be if it exists."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo superuser (admin / admin) unless it already exists."

    def handle(self, *args, **options):
        User = get_user_model()
        if User.objects.filter(username="admin").exists():
            self.stdout.write("Demo admin user already exists.")
            return
        User.objects.create_superuser("admin", "admin@example.com", "admin")
        self.stdout.write(self.style.SUCCESS("Created demo admin user: admin / admin."))
